"""A synthetic training corpus for the training tests: a word-level tokenizer (<bos> 0, <eos>
1, w2..w63) and Markov-chain documents, in the contract of sinklab.train.corpus.prepare_corpus;
shared by tests/test_train_run.py and tests/test_train_checkpoint.py."""
import os
from types import SimpleNamespace

import numpy as np

V, BOS, EOS = 64, 0, 1


# ------------------------------------------------------------------ synthetic corpus and packer
def write_tokenizer(folder: str) -> str:
    """A word-level tokenizer.json: <bos> 0, <eos> 1, w2..w63."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<bos>": BOS, "<eos>": EOS, **{f"w{i}": i for i in range(2, V)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<bos>", "<eos>"])
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    return path


def make_docs(n: int, seed: int = 0):
    """n documents of 20..160 tokens from a sparse Markov chain over ids 2..63."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(V - 2, 0.1), size=V - 2)
    cum = trans.cumsum(axis=1)
    docs = []
    for _ in range(n):
        L = int(rng.integers(20, 160))
        x = [int(rng.integers(0, V - 2))]
        for u in rng.random(L - 1):
            x.append(min(int(np.searchsorted(cum[x[-1]], u)), V - 3))
        docs.append(np.array(x, np.int64) + 2)
    return docs


def doc_stream(docs):
    """(tokens int32, document offsets int64) of docs, each followed by <eos>."""
    toks = np.concatenate([np.append(d, EOS) for d in docs]).astype(np.int32)
    offs = np.cumsum([0] + [len(d) + 1 for d in docs]).astype(np.int64)
    return toks, offs


def make_corpus(folder: str, n_train: int = 60, n_held: int = 16) -> SimpleNamespace:
    """The corpus contract of sinklab.train.corpus.prepare_corpus, synthetic."""
    docs = make_docs(n_train + n_held)
    tr, tro = doc_stream(docs[:n_train])
    he, heo = doc_stream(docs[n_train:])
    p = np.bincount(tr, minlength=V) / len(tr)
    p = p[p > 0]
    return SimpleNamespace(tokenizer=None, tokenizer_path=write_tokenizer(folder), bos_id=BOS, eos_id=EOS, vocab_size=V,
                           train_tokens=tr, train_doc_offsets=tro, heldout_tokens=he, heldout_doc_offsets=heo,
                           heldout_documents=lambda: list(docs[n_train:]), unigram_entropy=float(-(p * np.log(p)).sum()))


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)
