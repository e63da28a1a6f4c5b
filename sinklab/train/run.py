"""A training run: corpus, packing, the C engine, evaluation, logging and checkpoints, resumable
bitwise. ``sinklab train CONFIG.json`` and :func:`train` run it.

One run writes into ``out_dir``:

* ``log.jsonl``: one JSON line per report step (every ``eval_every``-th and
  ``checkpoint_every``-th step, and the last), see :data:`LOG_FIELDS`;
* ``step-NNNNNN/``: a checkpoint at every report step (:mod:`.checkpoint`), the newest
  ``keep_last`` kept plus those of ``keep_steps``, and ``latest`` naming the newest.

Resuming (the default when ``out_dir/latest`` exists) restores weights, Adam moments and step
bitwise and rewrites ``log.jsonl`` from the checkpoint's metrics, dropping lines written after
it; every batch is a pure function of (seed, step), so a run killed at any point and resumed
ends with the same weights, moments and log (timing fields aside: :data:`TIMING_FIELDS`) as an
uninterrupted one, for any thread count.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..progress import progress_bar
from ..runtime import get_num_threads, set_num_threads
from ..system import clean_stale, write_text_atomic
from ..tokenizer import Tokenizer
from . import checkpoint as ckpt_io
from .corpus import CORPORA, CORPUS_NAME, corpus_for
from ..families.config import ATTN_VARIANTS
from .engine import TRAIN_PRECISIONS, AdamW, Trainer, llama_config, lr_schedule
from .evaluate import EPS, eval_documents, evaluate
from .packing import Packer
from ..reprs import compact_repr

LOG_FILE = "log.jsonl"
MASKINGS = ("causal", "intra_doc")
# Test hook: seconds to sleep after every optimizer step, so a test can kill a run between
# checkpoints.
STEP_PAUSE_ENV = "SINKLAB_TEST_STEP_PAUSE"
# Fields of a log line that depend on the machine and its load, not on the run.
TIMING_FIELDS = ("tokens_per_s", "wall_s", "eval_s", "checkpoint_s")
LOG_FIELDS = {
    "step": "optimizer steps taken",
    "tokens": "training tokens seen (step x batch x context)",
    "lr": "learning rate of this step",
    "train_loss": "mean training cross-entropy (nats) over the steps since the previous line",
    "grad_norm": "global gradient L2 norm of this step, before clipping",
    "val_loss_bos": "held-out loss (nats), '<bos>+text' (null between evaluations)",
    "val_loss_text": "held-out loss (nats), 'text only', the same targets",
    "val_loss_train": "held-out loss (nats) on windows packed as in training",
    "sink_bos_0.3": "sink rate (fraction) at eps 0.3, '<bos>+text'; also sink_bos_0.8, sink_text_0.3, "
                    "sink_text_0.8",
    "importance_bos": "mean first-token importance a_0 over (document, layer, head), '<bos>+text'; also "
                      "importance_text (the sink rate's underlying value: it shows a trend before any head "
                      "crosses eps)",
    "tokens_per_s": "training throughput since the previous line (evaluation and checkpoints excluded)",
    "wall_s": "seconds of the run so far (all sessions)",
    "eval_s": "seconds this line's evaluation took",
    "checkpoint_s": "seconds the previous checkpoint write took",
}


class ConfigError(ValueError):
    """A training config that is not valid, or does not match the run being resumed."""


@dataclass
class TrainConfig:
    """One training run (the JSON file of ``sinklab train``; every key optional).

    Data:
        corpus_root: folder of the prepared corpus (None: the corpus module's default cache).
        corpus: which corpus (:data:`sinklab.train.corpus.CORPORA`): ``"pd-english"`` (23.9 MB
            of public-domain English: Austen, the KJV, two Bible commentaries) or
            ``"pd-english-xl"`` (those, then Scofield's notes, Shakespeare, The Devil's
            Dictionary and the GCIDE dictionary: 59.8 MB).
        vocab_size: BPE vocabulary size the corpus tokenizer is trained with (tokens); the
            model's vocabulary is the tokenizer's.

    Model (LLaMA-style: RMSNorm, RoPE, SwiGLU, no biases; :func:`llama_config`):
        d_model: residual width. n_layers: layers. n_heads: query heads. n_kv_heads: key/value
        heads (None: n_heads). d_ff: MLP width (None: 8/3 d_model rounded up to 64).
        rope_theta: RoPE base. norm_eps: RMSNorm epsilon. tied_embeddings: LM head = embedding.
        init_std: standard deviation of the initial matrices (W_O and W_down: / sqrt(2 L)).
        attention: ``"softmax"`` (the default), or an attention variant that removes the need for a
            ⟨bos⟩ sink (``ModelConfig.attn_variant``): ``"sink_logit"`` (a learned per-head logit
            s_h in the softmax denominator, initialised to 0, no weight decay), ``"softmax1"``
            (softmax-plus-one: s_h fixed at 0) or ``"gated"`` (a sigmoid gate on each head's
            attention output, W_g initialised N(0, init_std²), decayed like the matrices).

    Packing (the paper's §5 strategies):
        context: C, tokens per training window (and the model's context length).
        masking: ``"causal"`` over the whole window or ``"intra_doc"`` (a token sees only its
            own document).
        fixed_bos: a ⟨bos⟩ at position 0 of every window, visible to every token.

    Schedule and optimizer:
        tokens_per_step: tokens per optimizer step; batch = tokens_per_step // context windows
            (must divide evenly).
        total_tokens / steps: the run's length, in training tokens or optimizer steps (give
            one; total_tokens // tokens_per_step steps).
        lr, min_lr: peak and final learning rate (cosine decay after warmup).
        warmup_steps: optimizer steps of linear warmup.
        beta1, beta2, adam_eps, weight_decay: AdamW (decoupled decay on matrices and embedding).
        grad_clip: largest global gradient L2 norm (<= 0: no clipping).
        precision: ``"fp32"`` (the exact engine) or ``"bf16"`` (bf16 weight products in the
            forward and backward, fp32 master weights and AdamW; :class:`Trainer`).
        seed: the initial weights and the data order (batch = f(seed, step)).

    Evaluation and checkpoints (:mod:`.evaluate`):
        eval_every: optimizer steps between evaluations (the last step is always evaluated).
        checkpoint_every: optimizer steps between checkpoints (0: only at evaluations and the
            end); every evaluation writes one too.
        eval_docs: held-out documents (of >= 65 tokens) for the loss and sink rate.
        eval_windows: packed held-out windows for the training-format loss.
        eval_seed: the seed of those windows.
        keep_last: checkpoints kept (the newest; 0: all). keep_steps: steps whose checkpoints
            are never deleted.

    Where and how:
        out_dir: the run's folder (log.jsonl, step-NNNNNN/, latest).
        threads: OpenMP threads (None: sinklab's default); results do not depend on it.
    """

    corpus_root: Optional[str] = None
    corpus: str = CORPUS_NAME
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None
    d_ff: Optional[int] = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = False
    init_std: float = 0.02
    attention: str = "softmax"
    context: int = 256
    masking: str = "causal"
    fixed_bos: bool = False
    tokens_per_step: int = 8192
    total_tokens: Optional[int] = None
    steps: Optional[int] = 500
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 50
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    precision: str = "fp32"
    seed: int = 0
    eval_every: int = 100
    checkpoint_every: int = 0
    eval_docs: int = 64
    eval_windows: int = 16
    eval_seed: int = 1
    keep_last: int = 2
    keep_steps: List[int] = field(default_factory=list)
    out_dir: str = "sinklab-train"
    threads: Optional[int] = None

    # fields that may change when a run is resumed: they do not touch its numbers
    FREE_ON_RESUME = ("out_dir", "threads", "keep_last", "keep_steps", "corpus_root")

    @property
    def batch_size(self) -> int:
        """Windows per optimizer step: tokens_per_step // context."""
        return self.tokens_per_step // self.context

    @property
    def n_steps(self) -> int:
        """Optimizer steps of the run."""
        if self.steps is not None:
            return int(self.steps)
        if self.total_tokens is None:
            raise ConfigError("a training config needs steps or total_tokens")
        return int(self.total_tokens) // self.tokens_per_step

    def validate(self) -> "TrainConfig":
        """Checks every field; ConfigError naming the first bad one. Returns self."""
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        ints = ("vocab_size", "d_model", "n_layers", "n_heads", "context", "tokens_per_step", "warmup_steps",
                "seed", "eval_every", "checkpoint_every", "eval_docs", "eval_windows", "eval_seed", "keep_last")
        for k in ints:
            v = getattr(self, k)
            need(isinstance(v, int) and not isinstance(v, bool), f"{k} must be an integer, got {v!r}")
        for k in ("n_kv_heads", "d_ff", "total_tokens", "steps", "threads"):
            v = getattr(self, k)
            need(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                 f"{k} must be null or a positive integer, got {v!r}")
        for k in ("vocab_size", "d_model", "n_layers", "n_heads", "eval_docs", "eval_windows"):
            need(getattr(self, k) >= 1, f"{k} must be at least 1, got {getattr(self, k)}")
        need(self.d_model % self.n_heads == 0, f"d_model={self.d_model} is not a multiple of n_heads={self.n_heads}")
        need(self.n_kv_heads is None or self.n_heads % self.n_kv_heads == 0,
             f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        need(self.context >= 2, f"context must be at least 2 tokens, got {self.context}")
        need(self.tokens_per_step >= self.context and self.tokens_per_step % self.context == 0,
             f"tokens_per_step={self.tokens_per_step} must be a multiple of context={self.context} "
             f"(batch = tokens_per_step // context windows)")
        need((self.steps is None) != (self.total_tokens is None),
             f"give exactly one of steps and total_tokens (got steps={self.steps}, total_tokens={self.total_tokens})")
        need(self.n_steps >= 1, f"total_tokens={self.total_tokens} is less than one step of "
                                f"{self.tokens_per_step} tokens")
        need(self.attention in ATTN_VARIANTS,
             f"attention must be one of {list(ATTN_VARIANTS)}, got {self.attention!r}")
        need(self.precision in TRAIN_PRECISIONS,
             f"precision must be one of {sorted(TRAIN_PRECISIONS)}, got {self.precision!r}")
        need(self.masking in MASKINGS, f"masking must be one of {MASKINGS}, got {self.masking!r}")
        for k in ("fixed_bos", "tied_embeddings"):
            need(isinstance(getattr(self, k), bool), f"{k} must be true or false, got {getattr(self, k)!r}")
        for k in ("lr", "min_lr", "init_std", "rope_theta", "norm_eps", "adam_eps", "weight_decay", "grad_clip",
                  "beta1", "beta2"):
            v = getattr(self, k)
            need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                 f"{k} must be a finite number, got {v!r}")
        need(self.lr > 0 and 0 <= self.min_lr <= self.lr, f"need 0 <= min_lr <= lr and lr > 0 "
                                                          f"(lr={self.lr}, min_lr={self.min_lr})")
        need(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "beta1 and beta2 must lie in [0, 1)")
        need(self.adam_eps > 0 and self.init_std > 0 and self.norm_eps > 0 and self.rope_theta > 0,
             "adam_eps, init_std, norm_eps and rope_theta must be positive")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(self.warmup_steps >= 0 and self.eval_every >= 1 and self.checkpoint_every >= 0 and self.keep_last >= 0,
             "warmup_steps, checkpoint_every and keep_last must be >= 0, eval_every >= 1")
        need(isinstance(self.keep_steps, list) and all(isinstance(s, int) and not isinstance(s, bool)
                                                       for s in self.keep_steps),
             f"keep_steps must be a list of step numbers, got {self.keep_steps!r}")
        need(isinstance(self.out_dir, str) and self.out_dir != "", "out_dir must be a folder name")
        need(self.corpus_root is None or isinstance(self.corpus_root, str), "corpus_root must be null or a folder")
        need(self.corpus in CORPORA, f"corpus must be one of {', '.join(CORPORA)}, got {self.corpus!r}")
        return self

    def is_report_step(self, step: int) -> bool:
        """Whether optimizer step ``step`` logs a line and writes a checkpoint."""
        return (step % self.eval_every == 0 or step == self.n_steps
                or (self.checkpoint_every > 0 and step % self.checkpoint_every == 0))

    def is_eval_step(self, step: int) -> bool:
        return step % self.eval_every == 0 or step == self.n_steps

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TrainConfig":
        """A config from a dict (unknown keys are a ConfigError naming them)."""
        if not isinstance(d, dict):
            raise ConfigError(f"a training config is a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known: {sorted(known)}")
        d = dict(d)
        if "total_tokens" in d and "steps" not in d:
            d["steps"] = None  # total_tokens given: steps follow from it
        return cls(**d).validate()


def load_config(path: str) -> TrainConfig:
    """Reads a JSON training config; ConfigError (naming the file) when it is not valid."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None
    try:
        return TrainConfig.from_dict(d)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def example_config() -> str:
    """The default config as JSON text (what ``sinklab train --example`` prints)."""
    return json.dumps(TrainConfig().to_dict(), indent=2) + "\n"


@compact_repr
@dataclass
class RunResult:
    """What :func:`train` returns.

    Attributes:
        out_dir: the run's folder. config: its config.
        steps: optimizer steps taken in all. tokens: training tokens seen.
        resumed_from: the step it resumed from (None: started at step 0).
        checkpoint: the final checkpoint folder.
        log: the log lines (dicts, :data:`LOG_FIELDS`), from step 1 on.
        trainer: the engine, holding the final weights (``trainer.model`` runs every analysis).
        unigram_entropy: the training corpus's unigram entropy in nats per token (None if the
            corpus does not state it).
    """

    out_dir: str
    config: TrainConfig
    steps: int
    tokens: int
    resumed_from: Optional[int]
    checkpoint: str
    log: List[Dict[str, Any]]
    trainer: Trainer
    unigram_entropy: Optional[float] = None


def _tokenizer(corpus: Any) -> Any:
    """A :class:`sinklab.tokenizer.Tokenizer` of the corpus (with its ⟨bos⟩/⟨eos⟩ ids), or None."""
    tok = getattr(corpus, "tokenizer", None)
    if isinstance(tok, Tokenizer):
        return tok
    bos, eos = int(corpus.bos_id), int(corpus.eos_id)
    if tok is not None and hasattr(tok, "encode") and hasattr(tok, "get_vocab_size"):  # a tokenizers.Tokenizer
        return Tokenizer(tok, bos_token_id=bos, eos_token_id=eos, source=str(getattr(corpus, "tokenizer_path", "")))
    path = getattr(corpus, "tokenizer_path", None)
    if path:
        from tokenizers import Tokenizer as Backend

        return Tokenizer(Backend.from_file(str(path)), bos_token_id=bos, eos_token_id=eos, source=str(path))
    return None


def _vocab_size(corpus: Any, tok: Any) -> int:
    """The corpus's vocabulary size (its token ids), else its tokenizer's."""
    v = getattr(corpus, "vocab_size", None)
    if v is None and tok is not None:
        v = tok.vocab_size
    if v is None:
        raise ValueError("the corpus names no vocab_size and no tokenizer")
    return int(v)


def _write_log(path: str, records: List[Dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


def _append_log(path: str, record: Dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_log(out_dir: str) -> List[Dict[str, Any]]:
    """The lines of ``out_dir/log.jsonl`` as dicts."""
    with open(os.path.join(out_dir, LOG_FILE), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _start_over(out_dir: str) -> None:
    """Removes a previous run's checkpoints, ``latest`` and log from ``out_dir``."""
    for _, p in ckpt_io.list_checkpoints(out_dir):
        shutil.rmtree(p)
    for name in (ckpt_io.LATEST, LOG_FILE):
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))


def _check_same_run(config: TrainConfig, saved: Dict[str, Any], where: str) -> None:
    now = config.to_dict()
    # runs saved before these fields existed trained in fp32, with softmax attention, on the default corpus
    saved = {"precision": "fp32", "attention": "softmax", "corpus": CORPUS_NAME, **saved}
    diff = [k for k in now if k not in TrainConfig.FREE_ON_RESUME and saved.get(k) != now[k]]
    if diff:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in diff[:4])
        raise ConfigError(f"the config differs from the run in {where} ({shown}); resume with the same "
                          f"config, or start over (--no-resume, or another out_dir)")


def _pause_after_step() -> None:
    secs = os.environ.get(STEP_PAUSE_ENV)
    if secs:
        time.sleep(float(secs))


def _eval_fields(ev: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"val_loss_bos": None, "val_loss_text": None, "val_loss_train": None}
    for mode in ("bos", "text"):
        for e in EPS:
            out[f"sink_{mode}_{e:g}"] = None
        out[f"importance_{mode}"] = None
    if ev is None:
        return out
    out["val_loss_bos"], out["val_loss_text"] = ev["val_loss"]["bos"], ev["val_loss"]["text"]
    out["val_loss_train"] = ev["val_loss_train"]
    for mode in ("bos", "text"):
        for e in EPS:
            out[f"sink_{mode}_{e:g}"] = ev["sink_rate"][mode][f"{e:g}"]
        out[f"importance_{mode}"] = float(ev["importance"][mode].mean())
    return out


def train(config: TrainConfig, resume: bool = True, progress: bool = True, *, corpus: Any = None,
          packer_cls: Optional[Callable[..., Any]] = None) -> RunResult:
    """Trains a LLaMA-style model by ``config``, resuming from ``config.out_dir/latest`` when
    there is one (and ``resume``).

    Args:
        config: the run (:class:`TrainConfig`).
        resume: continue from the latest checkpoint of ``out_dir``; False starts over at step 0
            and deletes the checkpoints and log already in ``out_dir``.
        progress: a tqdm bar over the steps (loss, tokens/s).
        corpus: a prepared corpus (:func:`sinklab.train.corpus.prepare_corpus`'s result; None:
            prepare it from ``config.corpus_root`` and ``config.vocab_size``).
        packer_cls: the packer class (None: :class:`sinklab.train.packing.Packer`), called as
            ``packer_cls(tokens, doc_offsets, context, fixed_bos, bos_id, intra_doc)``.

    Returns:
        A :class:`RunResult`; the log is also in ``out_dir/log.jsonl``.

    Raises:
        ConfigError: an invalid config, or one that differs from the run being resumed.
        CheckpointError: the checkpoint to resume from is missing a file or corrupted.
        FloatingPointError: the loss became NaN or infinite.
        KeyboardInterrupt: Ctrl-C. The run stops at the next check (between C blocks of a step,
            or between steps), removes its half-written files and names, in the exception's
            message, the latest checkpoint a rerun resumes from.

    ``config.threads`` applies during the run only; the thread count is restored after it.
    """
    config.validate()
    threads_before = get_num_threads()
    if config.threads:
        set_num_threads(config.threads)
    try:
        return _train(config, resume, progress, corpus, packer_cls)
    except KeyboardInterrupt as e:
        e.args = (_interrupted(config.out_dir, e),)
        raise
    finally:
        set_num_threads(threads_before)


def _interrupted(out: str, e: KeyboardInterrupt) -> str:
    """After Ctrl-C: removes this process's half-written files from ``out`` (a checkpoint's
    temporary folder, ``latest`` or the log's temporary file) and says where the run resumes."""
    clean_stale(out)  # counts this process's own temporaries as stale: no save runs now
    try:
        latest = ckpt_io.latest_checkpoint(out)
    except ckpt_io.CheckpointError:
        latest = None
    said = f"{e.args[0]}; " if e.args and e.args[0] else ""
    if latest is None:
        return f"{said}training interrupted before its first checkpoint: a rerun starts at step 0"
    step = int(os.path.basename(latest).split("-")[1])
    return (f"{said}training interrupted; {latest} (step {step}) is the latest checkpoint: run again with the "
            f"same config and out_dir to resume from it")


def _train(config: TrainConfig, resume: bool, progress: bool, corpus: Any,
           packer_cls: Optional[Callable[..., Any]]) -> RunResult:
    out = config.out_dir
    latest = ckpt_io.latest_checkpoint(out) if resume else None
    if latest is not None:  # before the corpus, which may take minutes to prepare
        _check_same_run(config, ckpt_io.read_state(latest).get("run_config", {}), latest)
    if corpus is None:
        corpus = corpus_for(config, quiet=not progress)
    if packer_cls is None:
        packer_cls = Packer
    tok = _tokenizer(corpus)
    bos_id, eos_id = int(corpus.bos_id), int(corpus.eos_id)
    C, B, total = config.context, config.batch_size, config.n_steps
    mcfg = llama_config(_vocab_size(corpus, tok), d_model=config.d_model, n_layers=config.n_layers,
                        n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, d_ff=config.d_ff, context_length=C,
                        rope_theta=float(config.rope_theta), norm_eps=float(config.norm_eps),
                        tied_embeddings=config.tied_embeddings, bos_token_id=bos_id, eos_token_id=eos_id,
                        attn_variant=config.attention)
    opt = AdamW(beta1=float(config.beta1), beta2=float(config.beta2), eps=float(config.adam_eps),
                weight_decay=float(config.weight_decay), grad_clip=float(config.grad_clip))
    os.makedirs(out, exist_ok=True)
    clean_stale(out)
    log_path = os.path.join(out, LOG_FILE)
    resumed_from, wall0 = None, 0.0
    if latest is not None:
        ck = ckpt_io.load_checkpoint(latest)
        if ckpt_io.model_kwargs(mcfg) != ck.state["model"]:
            raise ConfigError(f"{ck.path} holds another model ({ck.state['model']}) than this corpus and config give")
        trainer = ckpt_io.trainer_from_checkpoint(ck, tok)
        records: List[Dict[str, Any]] = list(ck.state.get("metrics", []))
        resumed_from, wall0 = ck.step, float(ck.state.get("wall_s", 0.0))
        del ck  # its memory maps
    else:
        if not resume:
            _start_over(out)
        trainer = Trainer(mcfg, seed=config.seed, init_std=config.init_std, tokenizer=tok, optimizer=opt,
                          precision=config.precision)
        records = []
    _write_log(log_path, records)  # lines after the checkpoint (a killed run's) are dropped
    intra = config.masking == "intra_doc"
    packer = packer_cls(corpus.train_tokens, corpus.train_doc_offsets, C, config.fixed_bos, bos_id, intra)
    val_packer = packer_cls(corpus.heldout_tokens, corpus.heldout_doc_offsets, C, config.fixed_bos, bos_id, intra)
    docs = eval_documents(corpus.heldout_documents(), config.eval_docs)
    tok_path = getattr(corpus, "tokenizer_path", None)
    tok_path = None if tok_path is None else os.fspath(tok_path)
    entropy = getattr(corpus, "unigram_entropy", None)
    unigram_entropy = None if entropy is None else float(entropy)
    run_state = {"run_config": config.to_dict(), "seed": config.seed, "unigram_entropy": unigram_entropy}

    start = trainer.step_count
    t_run = time.perf_counter()
    t_mark, steps_since, losses, ckpt_s = t_run, 0, [], None
    bar = progress_bar(None, progress, desc=f"train C={C} {config.masking}{' +bos' if config.fixed_bos else ''}",
                       total=total, unit="step", initial=start)
    final = latest
    try:
        for step in range(start + 1, total + 1):
            ids, targets, key_start = packer.batch(step - 1, B, config.seed)
            lr = lr_schedule(step, config.lr, config.min_lr, config.warmup_steps, total)
            loss, gnorm = trainer.step(ids, targets, lr, key_start=key_start, keep_first=config.fixed_bos)
            if not (math.isfinite(loss) and math.isfinite(gnorm)):
                raise FloatingPointError(f"step {step}: loss {loss}, gradient norm {gnorm}; lower lr "
                                         f"(now {lr:.3g}) or grad_clip")
            losses.append(loss)
            steps_since += 1
            _pause_after_step()
            bar.update(1)
            if not config.is_report_step(step):
                if progress:
                    bar.set_postfix(loss=f"{loss:.3f}")
                continue
            t_eval = time.perf_counter()
            tok_s = steps_since * B * C / max(t_eval - t_mark, 1e-9)
            ev = None
            if config.is_eval_step(step):
                ev = evaluate(trainer.model, docs, C, bos_id, n_docs=config.eval_docs, packer=val_packer,
                              n_windows=config.eval_windows, window_seed=config.eval_seed,
                              keep_first=config.fixed_bos)
            eval_s = time.perf_counter() - t_eval
            wall = wall0 + (time.perf_counter() - t_run)
            rec = {"step": step, "tokens": step * B * C, "lr": lr, "train_loss": float(np.mean(losses)),
                   "grad_norm": gnorm, **_eval_fields(ev), "tokens_per_s": tok_s, "wall_s": wall,
                   "eval_s": eval_s, "checkpoint_s": ckpt_s}
            records.append(rec)
            t_ck = time.perf_counter()
            final = ckpt_io.save_checkpoint(trainer, out, {**run_state, "metrics": records, "wall_s": wall},
                                            tokenizer_path=tok_path, keep_last=config.keep_last,
                                            keep_steps=config.keep_steps, init_std=config.init_std)
            ckpt_s = time.perf_counter() - t_ck
            _append_log(log_path, rec)
            if progress:
                bar.set_postfix(loss=f"{rec['train_loss']:.3f}", tok_s=f"{tok_s:,.0f}",
                                **({"val": f"{ev['val_loss']['bos']:.3f}"} if ev else {}))
            losses, steps_since, t_mark = [], 0, time.perf_counter()
    finally:
        bar.close()
    if final is None:  # resumed a finished run
        final = ckpt_io.latest_checkpoint(out)
    if final is None:  # cannot happen: the last step always writes a checkpoint
        raise ckpt_io.CheckpointError(f"{out}: the run ended without a checkpoint")
    return RunResult(out_dir=out, config=config, steps=trainer.step_count, tokens=trainer.step_count * B * C,
                     resumed_from=resumed_from, checkpoint=final, log=records, trainer=trainer,
                     unigram_entropy=unigram_entropy)
