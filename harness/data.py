"""Lightning data modules: real text (byte-level, packed) and synthetic MQAR.

* :class:`TextDataModule`: a local text file through ``datasets.load_dataset("text", ...)`` or a Hugging Face
  hub dataset, tokenised to UTF-8 bytes (vocab 256, nothing to download), packed into ``seq_len + 1``
  windows (inputs and next-token targets), contiguous tail (or ``val_path``) held out for validation, token array
  cached; or (``pack=True``) split into documents and packed into rows with ``doc_ids`` and per-document
  ``positions`` (:class:`PackedDocDataset`, docs/documents.md "Training on packed documents").
* :class:`MQARDataModule`: multi-query associative recall (Arora et al. 2023, "Zoology", section 3), generated
  from a seed: the embedded default task, no files and no network.

Batches are ``(inputs, targets)``: int64 ``(B, seq_len)`` each; targets ``-100`` are ignored by the loss. Packed text
adds ``doc_ids`` and ``positions`` (int64 ``(B, seq_len)``).

Validation in a distributed run (DDP) sees every example once (:func:`val_sampler`), so ``val/loss`` and ``val/acc``
(sums over the ranks) equal the single-process values.
"""

from __future__ import annotations

import hashlib
import numbers
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

TOKENIZERS = ("byte",)
DOC_SPLITS = ("auto", "rows", "wikitext", "blank_line", "whole")
"""``data.doc_split`` values of :class:`TextDataModule` (how a corpus is cut into documents when ``data.pack=true``)."""


def val_sampler(datamodule: L.LightningDataModule, dataset, key: str):
    """The sampler of ``datamodule``'s validation ``DataLoader``: None (in order) in one process; in a distributed run
    (its Trainer's ``world_size > 1``) Lightning's ``UnrepeatedDistributedSampler``: rank ``r`` of ``w`` takes the
    examples ``r, r + w, r + 2w, ...`` in order, none repeated. Without it Lightning inserts a ``DistributedSampler``,
    which pads the last ranks' shares with the first examples when ``len(dataset)`` is not a multiple of ``w``, and
    those were counted twice in ``val/loss`` / ``val/acc`` (torchmetrics sums over the ranks). Lightning keeps a
    DataLoader's own ``DistributedSampler``.

    Raises:
        ValueError: naming ``key`` (the setting of the validation set's size) when the set has fewer examples than
            ranks: a rank without a batch would leave the others waiting in DDP's first forward.
    """
    trainer = getattr(datamodule, "trainer", None)
    kwargs = trainer.distributed_sampler_kwargs if trainer is not None and trainer.world_size > 1 else None
    if not kwargs:
        return None
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

    if len(dataset) < kwargs["num_replicas"]:
        raise ValueError(f"{key}: the validation set has {len(dataset)} examples, fewer than the "
                         f"{kwargs['num_replicas']} processes (trainer.devices x trainer.num_nodes) that each need one")
    return UnrepeatedDistributedSampler(dataset, shuffle=False, **kwargs)


# ---------------------------------------------------------------------------------------------- text
def _whole(name: str, value) -> int:
    """``data.<name>``, an integer (a bool, a float or a string is refused: ``int()`` truncated 1.5 to 1 silently and
    named no key for 'abc'). Raises ``ValueError`` naming ``data.<name>``; the range is checked by the caller."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"data.{name}={value!r} must be an integer")
    return int(value)


def _num_workers(n) -> int:
    """``data.num_workers``: DataLoader worker processes, an integer >= 0 (0: load in the main process)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"data.num_workers must be an integer >= 0 (0: load in the main process), got {n!r}")
    return n


class PackedDataset(Dataset):
    """Windows ``tokens[i*seq_len : i*seq_len + seq_len + 1]`` -> ``(x, y)`` with ``y`` shifted by one."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens = tokens
        self.seq_len = seq_len
        self.n = max((tokens.numel() - 1) // seq_len, 0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = i * self.seq_len
        w = self.tokens[s: s + self.seq_len + 1].long()
        return w[:-1], w[1:]


class PackedDocDataset(Dataset):
    """Rows of packed documents (:func:`pack_documents`): row ``i`` -> ``(x, y, doc_ids, positions)``, int64
    ``(seq_len,)`` each: inputs, next-token targets (every position scored, also the first token of a document
    after the last of the one before), the document of each input and its position inside its document in this row
    (:func:`row_positions`)."""

    def __init__(self, tokens: torch.Tensor, doc_ids: torch.Tensor, positions: torch.Tensor):
        self.tokens, self.doc_ids, self.positions = tokens.long(), doc_ids.long(), positions.long()

    def __len__(self):
        return self.tokens.shape[0]

    def __getitem__(self, i):
        w = self.tokens[i]
        return w[:-1], w[1:], self.doc_ids[i, :-1], self.positions[i, :-1]


def row_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """int64 ``(R, L)``: the position of each token inside its document within its row of ``doc_ids (R, L)``
    (nondecreasing rows): 0 at every document start and at the row start (a document continued from the row before
    starts again at 0; RoPE is relative, so inside a row only the differences matter)."""
    R, L = doc_ids.shape
    idx = torch.arange(L).expand(R, L)
    new = torch.ones_like(doc_ids, dtype=torch.bool)
    new[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start = torch.where(new, idx, torch.zeros_like(idx)).cummax(1).values
    return (idx - start).long()


def looks_like_wikitext(text: str) -> bool:
    """Whether ``text`` has WikiText's headings: an article title line `` = Title = `` and a section line
    `` = = Section = = `` (Merity et al. 2016's format)."""
    import re

    return bool(re.search(r"^ = [^=].* = $", text, re.M)) and bool(re.search(r"^ = = [^=].* = = $", text, re.M))


def byte_tokenize(text: str) -> np.ndarray:
    """UTF-8 bytes as tokens, uint8 ``(n_bytes,)``; vocab 256, one byte per token."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def unigram_entropy_bits(tokens: torch.Tensor, vocab_size: int = 256) -> float:
    """Entropy of the empirical token distribution, bits per token (the unigram baseline)."""
    counts = torch.bincount(tokens.long().flatten(), minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log2()).sum())


def max_text_seq_len(n_train_tokens: int, n_val_tokens: int, batch_size: int) -> int:
    """The longest ``seq_len`` that trains on these splits (0: none does).

    Windows of ``seq_len + 1`` tokens start every ``seq_len`` tokens (:class:`PackedDataset`), so a split of ``n``
    tokens holds ``(n - 1) // seq_len`` of them. Training drops the last partial batch, so the train split must
    hold ``batch_size`` windows (``seq_len <= (n_train - 1) // batch_size``); validation needs one window
    (``seq_len <= n_val - 1``).
    """
    return max(min((int(n_train_tokens) - 1) // max(int(batch_size), 1), int(n_val_tokens) - 1), 0)


def _connection_errors() -> tuple:
    """The exceptions of a Hub that cannot be reached: ``ConnectionError`` (``datasets``' "Couldn't reach ... on the
    Hub", ``huggingface_hub``'s offline mode) and ``requests``' connection / timeout errors."""
    errs = [ConnectionError, TimeoutError]
    try:
        import requests

        errs += [requests.exceptions.ConnectionError, requests.exceptions.Timeout]
    except ImportError:  # pragma: no cover (datasets needs requests)
        pass
    return tuple(errs)


def missing_file_error(key: str, given: str, absolute: str) -> FileNotFoundError:
    """The error for a ``data.path`` / ``data.val_path`` entry that is not a file: ``given`` as the user wrote it,
    ``absolute`` where it was looked for."""
    return FileNotFoundError(
        f"{key}={given!r} does not exist or is not a file (absolute: {absolute}; relative paths are taken from the "
        f"directory train.py was launched in); pass {key}=<your text file> (an absolute path works from anywhere), or "
        f"data.path=null data.hub_name=<dataset> for a hub dataset")


class TextDataModule(L.LightningDataModule):
    """Byte-level language modelling on a text corpus.

    Args:
        path: local text file (or list of files). Missing -> ``FileNotFoundError`` naming ``data.path``.
        hub_name / hub_config / hub_split / text_column: a hub dataset (used when ``path`` is None; needs
            network on first use, then ``datasets``' cache).
        seq_len: tokens per training window (each window holds ``seq_len + 1`` tokens for the shift). At most
            :func:`max_text_seq_len` of the splits: :meth:`setup` raises ``ValueError`` naming ``data.seq_len`` and
            that limit when the train split cannot fill one batch or the validation split one window.
        val_fraction: fraction of the token stream (its contiguous tail) held out for validation.
        tokenizer: ``"byte"`` (UTF-8 bytes, vocab 256).
        cache_dir: where the token array is cached, keyed by path, size, mtime and tokenizer, and where
            ``datasets`` caches the parsed text (``<cache_dir>/datasets``). None: no ``.pt`` cache; ``datasets``
            caches in its default folder (``~/.cache/huggingface/datasets``).
        max_bytes: optional cap on the corpus size (quick runs): the first that many bytes of the text (with
            ``pack=True``, of the text before it is split into documents, separators included).
        pack: ``False`` (default): the corpus is one token stream cut into windows; attention and positions run on
            across documents. ``True``: the corpus is split into documents (``doc_split``), concatenated (optionally
            with ``eos`` after each) and cut into rows of ``seq_len + 1`` tokens (:func:`pack_documents`); batches
            are ``(x, y, doc_ids, positions)`` (:class:`PackedDocDataset`). The tail shorter than one row is dropped
            and counted: :attr:`pack_stats` (``data/{train,val}_{tokens,docs}_{kept,dropped}``, and the separator
            bytes the split rule removes, ``data/bytes_between_docs``, ``data/val_bytes_between_docs``; logged by ``LitLM``
            at the start of training) and one printed line. No ``.pt`` token cache (splitting is fast).
            A local file's carriage returns: ``datasets``' text loader reads ``\\r\\n`` and ``\\r`` as ``\\n``;
            the bytes that removes are counted in :attr:`bytes_normalised` (per list of files read;
            ``data/bytes_normalised`` with ``pack=True``) and warned about, so tokens + separators + that count add up
            to the files' sizes.
        doc_split: how ``pack=True`` finds documents (:data:`DOC_SPLITS`): ``rows`` (each dataset row: a hub
            dataset's rows, a local file whole), ``wikitext`` (articles, `` = Title = `` lines), ``blank_line``,
            ``whole`` (each file one document), ``auto`` (default: ``wikitext`` when the text has WikiText's
            article and section headings, :func:`looks_like_wikitext`; else ``rows`` for a hub dataset and
            ``blank_line`` for local files).
        doc_mask: with ``pack=True``, whether the model is given the documents (:attr:`model_documents`): ``True``
            (default): attention, recurrent state and short convolutions stay inside each document and RoPE positions
            restart at each document; ``False``: the plain packed baseline (the same rows and targets, attention across
            documents, positions ``0 .. seq_len - 1``). Loss and bpb are per token either way.
        val_path: a separate validation file (or list), e.g. WikiText-2's ``test.txt``: all of ``path`` trains, and
            ``val_fraction`` is not used. None: the tail ``val_fraction`` of the tokens (packed: the document at the
            cut is split in two).
        eos: ``pack=True`` only: a separator token appended to every document (an id in ``[0, vocab_size)`` the text
            does not hold, e.g. 0; ``ValueError`` otherwise), or None (default). Its targets are scored; ``bpb``
            divides by the bytes of text only (:attr:`bytes_per_token` < 1).

    Bad option values raise ``ValueError`` naming the option (``data.pack``, ``data.doc_split``, ``data.doc_mask``,
    ``data.eos``) and the allowed values; ``data.eos`` or a ``data.doc_split`` other than ``auto`` without
    ``data.pack=true`` raise too (they would go unused).

    Attributes after :meth:`setup`: ``bytes_per_token`` (1.0 for bytes; for bits-per-byte
    ``bpb = loss_nats / ln 2 / bytes_per_token``), ``train_tokens``, ``val_tokens``, ``vocab_size``.
    """

    def __init__(self, path=None, hub_name: Optional[str] = None, hub_config: Optional[str] = None,
                 hub_split: str = "train", text_column: str = "text", seq_len: int = 256, batch_size: int = 32,
                 val_fraction: float = 0.1, tokenizer: str = "byte", cache_dir: Optional[str] = None,
                 max_bytes: Optional[int] = None, num_workers: int = 0, shuffle: bool = True, seed: int = 0,
                 vocab_size: int = 256, pack: bool = False, doc_split: str = "auto", doc_mask: bool = True,
                 val_path=None, eos: Optional[int] = None):
        super().__init__()
        if not isinstance(pack, bool):
            raise ValueError(f"data.pack must be true or false, got {pack!r}")
        if doc_split not in DOC_SPLITS:
            raise ValueError(f"data.doc_split={doc_split!r} is not supported; allowed values: {', '.join(DOC_SPLITS)}")
        if not isinstance(doc_mask, bool):
            raise ValueError(f"data.doc_mask must be true or false, got {doc_mask!r}")
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < vocab_size):
            raise ValueError(f"data.eos must be null (no separator) or a token id in [0, {vocab_size}) (e.g. 0, a byte "
                             f"that plain text does not hold), got {eos!r}")
        if eos is not None and not pack:
            raise ValueError(f"data.eos={eos} separates packed documents: it needs data.pack=true (or data.eos=null)")
        if doc_split != "auto" and not pack:  # else silently unused: the run would train on unsplit text
            raise ValueError(f"data.doc_split={doc_split!r} cuts the text into packed documents: it needs "
                             f"data.pack=true (or data.doc_split=auto)")
        if not doc_mask and not pack:  # else silently unused: unpacked windows have no documents to mask between
            raise ValueError("data.doc_mask=false lets attention cross packed documents: it needs data.pack=true (or "
                             "data.doc_mask=true, the default)")
        self.pack, self.doc_split, self.doc_mask, self.eos = pack, doc_split, doc_mask, eos
        self.val_path = val_path
        self.pack_stats: Dict[str, float] = {}
        self.doc_sources: list = []
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"data.tokenizer={tokenizer!r} is not supported; allowed values: {', '.join(TOKENIZERS)}")
        if not 0.0 < float(val_fraction) < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction!r}")
        if path is None and hub_name is None:
            raise ValueError("set data.path (a local text file) or data.hub_name (a hub dataset)")
        if vocab_size != 256:
            raise ValueError(f"data.vocab_size must be 256 for the byte tokenizer, got {vocab_size}")
        self.path = path
        self.hub_name, self.hub_config, self.hub_split, self.text_column = hub_name, hub_config, hub_split, text_column
        self.seq_len, self.batch_size = _whole("seq_len", seq_len), _whole("batch_size", batch_size)
        self.val_fraction = float(val_fraction)
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len must be >= 1, got {self.seq_len}")
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {self.batch_size}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            # -1 kept all but the last byte, 0 the whole corpus
            raise ValueError(f"data.max_bytes must be null (the whole corpus) or an integer >= 1, got {max_bytes!r}")
        self.tokenizer, self.cache_dir, self.max_bytes = tokenizer, cache_dir, max_bytes
        self.bytes_normalised = {}  # (files read) -> carriage-return bytes datasets' text loader turned into newlines
        self.num_workers, self.shuffle, self.seed = _num_workers(num_workers), shuffle, seed
        self.vocab_size = 256
        self.bytes_per_token = 1.0
        self.train_tokens: Optional[torch.Tensor] = None
        self.val_tokens: Optional[torch.Tensor] = None
        self._check_paths()

    # -- loading
    def _paths(self, path=False) -> Sequence[str]:
        path = self.path if path is False else path
        if path is None:
            return []
        return [str(p) for p in (path if isinstance(path, (list, tuple)) else [path])]

    def _check_paths(self):
        for key, path in (("data.path", self.path), ("data.val_path", self.val_path)):
            for p in self._paths(path):
                if not os.path.isfile(p):
                    raise missing_file_error(key, p, os.path.abspath(p))
        train = self._paths()
        same = [v for v in self._paths(self.val_path) if any(os.path.samefile(v, t) for t in train)]
        if same:  # validating on text the model trains on: val/* measure memorisation
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"data.val_path={self.val_path!r} is the same file as data.path ({', '.join(same)}): the "
                           f"run validates on its own training text, so val/loss and val/bpb measure memorisation, not "
                           f"generalisation; pass another file as data.val_path, or data.val_path=null to hold out the "
                           f"tail data.val_fraction={self.val_fraction} of data.path")

    def _cache_file(self, paths: Sequence[str]) -> Optional[Path]:
        if self.cache_dir is None or not paths:
            return None
        h = hashlib.sha1()
        for p in paths:
            st = os.stat(p)
            h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns}|".encode())
        h.update(f"{self.tokenizer}|{self.max_bytes}".encode())
        return Path(self.cache_dir) / f"tokens-{h.hexdigest()[:16]}.pt"

    def _datasets_cache_dir(self) -> Optional[str]:
        """``<data.cache_dir>/datasets``: where ``datasets.load_dataset`` keeps its copy of the dataset (its default,
        ``~/.cache/huggingface/datasets``, only without a ``data.cache_dir``)."""
        return None if self.cache_dir is None else str(Path(self.cache_dir) / "datasets")

    def _load_text(self, paths: Optional[Sequence[str]] = None) -> str:
        return "\n".join(self._load_rows(paths))

    def _load_rows(self, paths: Optional[Sequence[str]] = None) -> List[str]:
        """The dataset's rows (strings): one per local file (``paths``, default ``data.path``), or the hub
        dataset's rows of ``data.text_column``."""
        import datasets

        paths = self._paths() if paths is None else list(paths)
        crlf = bare_cr = 0
        if paths:
            for p in paths:  # datasets' text builder fails on other bytes with a DatasetGenerationError
                with open(p, "rb") as f:  # that names neither the file nor the cause
                    raw = f.read()
                    crlf, bare_cr = crlf + raw.count(b"\r\n"), bare_cr + raw.count(b"\r") - raw.count(b"\r\n")
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"data.path={p!r} is not UTF-8 text (byte {e.start}: {e.reason}); the byte "
                                         f"tokenizer reads UTF-8 text files: pass a UTF-8 text file") from None
            ds = datasets.load_dataset("text", data_files=list(paths), sample_by="document", split="train",
                                       cache_dir=self._datasets_cache_dir())
        else:  # hub dataset (network on first use)
            try:
                ds = datasets.load_dataset(self.hub_name, self.hub_config, split=self.hub_split,
                                           cache_dir=self._datasets_cache_dir())
            except _connection_errors() as e:  # datasets' own message after retries and a traceback: say what to do
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                from .errors import ConfigConnectionError

                raise ConfigConnectionError(
                    f"data.hub_name={self.hub_name!r}: the Hugging Face Hub could not be reached to load it "
                    f"(hub_config={self.hub_config!r}, hub_split={self.hub_split!r}; {type(e).__name__}: {why}), and "
                    f"no copy is cached under {self._datasets_cache_dir() or '~/.cache/huggingface/datasets'}; run "
                    f"where the Hub is reachable once, or train on a local text file: data.path=<file> (e.g. "
                    f"data.path=../shared/data/wikitext-2/valid.txt) with data.hub_name=null") from None
        if self.text_column not in ds.column_names:
            raise ValueError(f"data.text_column={self.text_column!r} not in dataset columns {ds.column_names}")
        rows = list(ds[self.text_column])
        if paths:  # datasets reads text files with universal newlines: "\r\n" and "\r" arrive as "\n"
            lost = sum(os.path.getsize(p) for p in paths) - sum(len(r.encode("utf-8")) for r in rows)
            self.bytes_normalised[tuple(os.path.abspath(p) for p in paths)] = lost
            if lost or bare_cr:
                from lightning.pytorch.utilities.rank_zero import rank_zero_warn

                rank_zero_warn(f"data.path: {[os.path.abspath(p) for p in paths]} holds {crlf:,} \\r\\n line endings "
                               f"and {bare_cr:,} bare \\r, which datasets' text loader reads as \\n ({lost:,} bytes "
                               f"fewer): the model sees the normalised text, and bpb is per byte of it")
        return rows

    def load_tokens(self, paths: Optional[Sequence[str]] = None) -> torch.Tensor:
        """The whole corpus (``paths``, default ``data.path``) as a token tensor (uint8 for bytes), from the cache
        when valid."""
        paths = self._paths() if paths is None else list(paths)
        cache = self._cache_file(paths)
        if cache is not None and cache.exists():
            blob = torch.load(cache, weights_only=True)
            return blob["tokens"]
        text = self._load_text(paths)
        data = byte_tokenize(text)
        if self.max_bytes:
            data = data[: int(self.max_bytes)]
        tokens = torch.from_numpy(data.copy())
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp{os.getpid()}")
            torch.save({"tokens": tokens, "paths": list(paths)}, tmp)
            os.replace(tmp, cache)
        return tokens

    def source(self) -> str:
        """What this module reads, for the log: each file's absolute path and size, or the hub dataset."""
        def files(path):
            return ", ".join(f"{os.path.abspath(p)} ({os.path.getsize(p):,} bytes)" for p in self._paths(path))

        text = f"data.path={files(self.path)}" if self.path is not None else f"data.hub_name={self.hub_name!r}"
        return text + (f"; data.val_path={files(self.val_path)}" if self.val_path is not None else "")

    def setup(self, stage: Optional[str] = None):
        if self.train_tokens is not None:
            return
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        rank_zero_info(f"data: {self.source()}")  # data=text reads conf/data/text.yaml's file when none is given
        if self.pack:
            return self._setup_packed()
        if self.val_path is not None:  # a separate validation file: the whole data.path trains
            train, val = self.load_tokens(), self.load_tokens(self._paths(self.val_path))
            limit = max_text_seq_len(train.numel(), val.numel(), self.batch_size)
            if limit < 1:
                raise ValueError(
                    f"these files are too small to train: no data.seq_len fills one batch of "
                    f"data.batch_size={self.batch_size} windows in data.path ({train.numel()} tokens) and one window "
                    f"in data.val_path ({val.numel()} tokens); pass larger files")
            if self.seq_len > limit:
                raise ValueError(
                    f"data.seq_len={self.seq_len} is too long for these files: the longest data.seq_len they can "
                    f"train is {limit} (data.path, {train.numel()} tokens, must fill one batch of "
                    f"data.batch_size={self.batch_size} windows of seq_len + 1 tokens, data.val_path, "
                    f"{val.numel()} tokens, one window); pass data.seq_len<={max(limit, 1)} or larger files")
            self.train_tokens, self.val_tokens = train, val
            self.train_set = PackedDataset(train, self.seq_len)
            self.val_set = PackedDataset(val, self.seq_len)
            return
        tokens = self.load_tokens()
        n_val = int(round(tokens.numel() * self.val_fraction))
        limit = max_text_seq_len(tokens.numel() - n_val, n_val, self.batch_size)
        if limit < 1:
            raise ValueError(
                f"data.path={self.path if self.path is not None else self.hub_name!r} is too small to train: "
                f"{tokens.numel()} tokens, and no data.seq_len fills one batch of data.batch_size={self.batch_size} "
                f"windows in the train split ({tokens.numel() - n_val} tokens) and one window in the validation split "
                f"({n_val} tokens at data.val_fraction={self.val_fraction}); pass a larger corpus")
        if self.seq_len > limit:
            raise ValueError(
                f"data.seq_len={self.seq_len} is too long for this corpus: the longest data.seq_len it can train is "
                f"{limit} (the train split, {tokens.numel() - n_val} tokens, must fill one batch of "
                f"data.batch_size={self.batch_size} windows of seq_len + 1 tokens, and the validation split, "
                f"{n_val} tokens at data.val_fraction={self.val_fraction}, one window); pass data.seq_len<={limit}, "
                f"a smaller data.batch_size or a larger corpus"
            )
        self.train_tokens = tokens[: tokens.numel() - n_val]
        self.val_tokens = tokens[tokens.numel() - n_val:]  # contiguous tail
        self.bytes_per_token = 1.0  # byte tokenizer; a subword tokenizer would report bytes / tokens
        self.train_set = PackedDataset(self.train_tokens, self.seq_len)
        self.val_set = PackedDataset(self.val_tokens, self.seq_len)

    # -- packed documents (data.pack=true)
    def _split_rule(self, text: str, hub: bool) -> str:
        """``data.doc_split`` with ``auto`` resolved: ``wikitext`` when the text has WikiText's headings (an article
        line `` = Title = `` and a section line `` = = Section = = ``), else ``rows`` for a hub dataset (its rows
        are the documents) and ``blank_line`` for a local file."""
        if self.doc_split != "auto":
            return self.doc_split
        if looks_like_wikitext(text):
            return "wikitext"
        return "rows" if hub else "blank_line"

    def _check_single_documents(self, rule: str, sources, key: str) -> None:
        """A split that finds one document in a source (a file, or the hub dataset) of more than one packed row
        (``seq_len + 1`` tokens): its documents are not found (``wikitext`` without a `` = Title = `` line,
        ``blank_line`` without a blank line), so packing (``data.pack=true``) trains it as one stream. With
        ``data.doc_mask=true`` (the document mask asked for, and it would mask nothing) a ``ValueError``, else a
        warning. ``whole`` (and ``rows`` of a local file: each file whole) asks for that and is not checked."""
        if rule == "whole":
            return
        why = {"wikitext": "no article heading (a line ' = Title = ')", "blank_line": "no blank line between documents",
               "rows": "a single non-empty row"}.get(rule, f"one document by the {rule!r} rule")
        for name, size, n_docs in sources:
            if n_docs != 1 or size <= self.seq_len + 1:
                continue
            split = f"data.doc_split={self.doc_split}" + (f" (-> {rule})" if self.doc_split != rule else "")
            msg = (f"{split} found {why} in {key}={name!r} ({size:,} bytes, more than one row of data.seq_len + 1 = "
                   f"{self.seq_len + 1} tokens): the whole text is one document")
            fix = (f"pass the data.doc_split that finds this text's documents (allowed values: "
                   f"{', '.join(DOC_SPLITS)}), data.doc_split=whole to pack it as one document on purpose")
            if self.doc_mask:
                raise ValueError(f"{msg}, so the document mask (data.doc_mask=true) would separate nothing; {fix}, "
                                 f"or data.pack=false for one unsplit stream")
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"{msg}; {fix}")

    def load_documents(self, paths: Optional[Sequence[str]] = None,
                       key: Optional[str] = None) -> Tuple[List[np.ndarray], str, int]:
        """The corpus (``paths``, default ``data.path`` or the hub dataset) as tokenized documents (uint8 arrays for
        bytes), the split rule used (:attr:`doc_split`, ``auto`` resolved by :meth:`_split_rule`) and the number of
        bytes between documents (separators the rule removes: blank lines, whitespace-only pieces). ``rows``: each
        row of the dataset is a document (a local file is one row); the other rules split the rows' text
        (:func:`split_documents`; local files one by one, a hub dataset's rows joined with newlines).
        ``data.max_bytes`` keeps the first that many bytes of the text (the document at the cut is cut; a
        character the cut splits is dropped), before splitting, so the separators counted are those read."""
        hub = not (self._paths() if paths is None else paths)
        rows = self._load_rows(paths)
        if self.max_bytes:  # the first max_bytes bytes of the text (hub rows as they are joined below)
            capped, left = [], int(self.max_bytes)
            for r in rows:
                if left <= 0:
                    break
                b = r.encode("utf-8")
                capped.append(r if len(b) <= left else b[:left].decode("utf-8", errors="ignore"))
                left -= len(b) + (1 if hub else 0)
            rows = capped
        rule = self._split_rule("\n".join(rows[:1000]) if hub else "\n".join(rows), hub)
        if rule == "rows":
            texts = list(rows)
            sources = [(self.hub_name, sum(len(r.encode("utf-8")) for r in rows), len([r for r in rows if r]))] \
                if hub else []  # rows of a local file: each file whole, as data.doc_split=rows says
        elif hub:
            texts = split_documents("\n".join(rows), rule)
            sources = [(self.hub_name, sum(len(r.encode("utf-8")) for r in rows), len(texts))]
        else:
            per_file = [split_documents(r, rule) for r in rows]
            texts = [d for ds in per_file for d in ds]
            sources = [(str(p), len(r.encode("utf-8")), len(ds))
                       for p, r, ds in zip(paths or self._paths(), rows, per_file)]
        # checked by _setup_packed after the size checks (a file too small to train is said first)
        self.doc_sources.append((rule, sources, key or ("data.hub_name" if hub else "data.path")))
        docs = [byte_tokenize(t) for t in texts]
        between = sum(len(r.encode("utf-8")) for r in rows) + (len(rows) - 1 if hub else 0) - sum(d.size for d in docs)
        if rule == "rows" and hub:
            between -= len(rows) - 1  # the rows are not joined
        return docs, rule, between

    def _setup_packed(self):
        self.doc_sources = []  # (rule, [(file or hub name, bytes, documents found)], key) of each load_documents
        docs, rule, between = self.load_documents()
        val_between = 0
        what = self.path if self.path is not None else self.hub_name
        if self.val_path is not None:
            val_docs, _, val_between = self.load_documents(self._paths(self.val_path), key="data.val_path")
            train_docs, val_key = docs, "data.val_path"
        else:  # the last val_fraction of the tokens; the document at the cut is split in two
            n = sum(d.size for d in docs)
            cut = n - int(round(n * self.val_fraction))
            train_docs, val_docs, seen = [], [], 0
            for d in docs:
                if seen + d.size <= cut:
                    train_docs.append(d)
                elif seen >= cut:
                    val_docs.append(d)
                else:
                    train_docs.append(d[: cut - seen])
                    val_docs.append(d[cut - seen:])
                seen += d.size
            val_key = "data.val_fraction"
        if self.eos is not None:
            for d in train_docs + val_docs:
                if (d == self.eos).any():
                    raise ValueError(f"data.eos={self.eos} occurs in the text ({what!r}); the separator must be a "
                                     f"token the text does not hold (e.g. data.eos=0), or data.eos=null")
        tr = pack_documents(train_docs, self.seq_len, self.eos)
        va = pack_documents(val_docs, self.seq_len, self.eos)
        n_tr, n_va = tr["tokens"].shape[0], va["tokens"].shape[0]
        n_tr_tokens, n_va_tokens = (d["tokens_kept"] + d["tokens_dropped"] for d in (tr, va))
        if n_tr_tokens // 2 < self.batch_size or n_va_tokens < 2:  # not even rows of 2 tokens (data.seq_len=1) fill
            val_only = self.val_path is not None and n_tr_tokens // 2 >= self.batch_size
            short = f"data.val_path={self.val_path!r}" if val_only else f"data.path={what!r}"
            raise ValueError(
                f"{short} is too small to train packed (data.pack=true): no data.seq_len fills one batch of "
                f"data.batch_size={self.batch_size} rows in the train split ({len(train_docs)} documents, "
                f"{n_tr_tokens} tokens) and one row in the validation split ({val_key}, {len(val_docs)} documents, "
                f"{n_va_tokens} tokens); pass a larger corpus")
        if n_tr < self.batch_size or n_va < 1:
            raise ValueError(
                f"data.seq_len={self.seq_len} is too long for this corpus packed (data.pack=true): the train split "
                f"({what!r}, {len(train_docs)} documents, {tr['tokens_kept'] + tr['tokens_dropped']} tokens) packs "
                f"{n_tr} rows of seq_len + 1 tokens, data.batch_size={self.batch_size} are needed; the validation split "
                f"({val_key}, {len(val_docs)} documents) packs {n_va}, 1 is needed; pass a smaller data.seq_len, a "
                f"smaller data.batch_size or a larger corpus")
        for split_rule, sources, key in self.doc_sources:  # a split that found one document in a large file
            self._check_single_documents(split_rule, sources, key)
        for d in (tr, va):  # positions restart at each row: a document continued from the row before starts at 0
            d["positions"] = row_positions(d["doc_ids"])
        self.train_packed, self.val_packed = tr, va
        self.train_tokens, self.val_tokens = tr["tokens"].flatten(), va["tokens"].flatten()
        # bits per byte of text: an eos target is scored but is not a byte of the text
        self.bytes_per_token = 1.0 if self.eos is None else float((va["tokens"][:, 1:] != self.eos).double().mean())
        self.train_set = PackedDocDataset(tr["tokens"], tr["doc_ids"], tr["positions"])
        self.val_set = PackedDocDataset(va["tokens"], va["doc_ids"], va["positions"])
        self.pack_stats = {f"data/{split}_{k}": float(d[k]) for split, d in (("train", tr), ("val", va))
                           for k in ("tokens_kept", "tokens_dropped", "docs_kept", "docs_dropped")}
        self.pack_stats.update({"data/train_rows": float(n_tr), "data/val_rows": float(n_va),
                                "data/bytes_normalised": float(sum(self.bytes_normalised.values())),
                                "data/bytes_between_docs": float(between),
                                "data/val_bytes_between_docs": float(val_between)})
        self.doc_split_used = rule
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        rank_zero_info(
            f"data.pack=true (doc_split={self.doc_split} -> {rule}, doc_mask={self.doc_mask}, eos={self.eos}): "
            + "; ".join(f"{split}: {len(src)} documents -> {d['tokens'].shape[0]} rows of {self.seq_len + 1} "
                        f"tokens, kept {d['tokens_kept']} tokens / {d['docs_kept']} documents, dropped "
                        f"{d['tokens_dropped']} tokens (the tail shorter than one row) / {d['docs_dropped']} "
                        f"documents (empty or wholly in that tail)"
                        for split, src, d in (("train", train_docs, tr), ("val", val_docs, va)))
            + f"; {between} bytes of data.path between documents (separators the {rule!r} rule removes)"
            + (f", {val_between} of data.val_path" if self.val_path is not None else ""))

    @property
    def model_documents(self) -> bool:
        """Whether the model is given the batches' ``doc_ids`` / ``positions`` (``data.pack`` and
        ``data.doc_mask``): attention and recurrent state stay inside each document, RoPE positions restart."""
        return bool(self.pack and self.doc_mask)

    def unigram_bits_per_byte(self) -> float:
        """Unigram entropy of the train split, bits per byte (the baseline a model must beat)."""
        self.setup()
        return unigram_entropy_bits(self.train_tokens, self.vocab_size) / self.bytes_per_token

    def train_dataloader(self):
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle, drop_last=True,
                          num_workers=self.num_workers, generator=g)

    def val_dataloader(self):
        """The validation windows in order; in DDP each once over the ranks (:func:`val_sampler`)."""
        key = "data.val_path" if self.val_path is not None else "data.val_fraction"
        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          sampler=val_sampler(self, self.val_set, key))


# ---------------------------------------------------------------------------------------------- MQAR
class BatchedTensorDataset(TensorDataset):
    """A :class:`TensorDataset` whose batches are fetched with one indexing operation per tensor.

    ``DataLoader`` calls :meth:`__getitems__` with a batch's indices (and :func:`collate_batched` keeps the result), so
    a batch of 256 MQAR examples costs one gather per tensor instead of 256 ``__getitem__`` calls and a
    ``torch.stack`` (seq_len 256, one CPU thread: 0.3 instead of 1.0 ms of host time a batch, against a host-bound
    step of about 10 ms for the fig-2 models on an H200). Same samplers, same order, same batches (``tests/test_data.py``): the shuffle and a
    ``DistributedSampler`` only choose the indices."""

    def __getitems__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.long)
        return [t.index_select(0, idx) for t in self.tensors]


def collate_batched(batch):
    """``collate_fn`` of :class:`BatchedTensorDataset`: the batch is already stacked."""
    return batch


def _distinct_ints(rows: int, k: int, low: int, high: int, g: torch.Generator) -> torch.Tensor:
    """``(rows, k)`` int64, each row ``k`` distinct integers drawn uniformly from ``[low, high)`` (needs
    ``k <= high - low``). Rejection sampling: draw, then redraw the later copy of any repeated value until none is
    left; memory ``O(rows * k)`` whatever the range. Deterministic in ``g``."""
    out = torch.randint(low, high, (rows, k), generator=g)
    for _ in range(10_000):
        srt, order = out.sort(dim=1)
        dup_sorted = torch.zeros_like(srt, dtype=torch.bool)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
        if not bool(dup_sorted.any()):
            return out
        dup = torch.zeros_like(dup_sorted).scatter_(1, order, dup_sorted)  # back to the original slots
        out = torch.where(dup, torch.randint(low, high, (rows, k), generator=g), out)
    raise RuntimeError(f"could not draw {k} distinct values from [{low}, {high})")  # pragma: no cover


def generate_mqar(num_examples: int, seq_len: int, vocab_size: int, num_kv_pairs: int, power_a: float = 0.01,
                  seed: int = 0, random_non_queries: bool = True):
    """Multi-query associative recall (Arora et al. 2023, "Zoology", section 3 and appendix).

    Each example starts with ``num_kv_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys distinct, drawn from
    ``1 .. vocab_size/2 - 1``; values drawn from ``vocab_size/2 .. vocab_size - 1``). The rest of the
    sequence holds every key once more as a query, at gap ``g`` (in token pairs) drawn without
    replacement with ``P(g) ~ a * g^(a-1)`` (power law, ``a = power_a``; small ``a`` favours short gaps).
    The target at a query position is the value bound to that key; every other target is ``-100``.
    Non-query slots hold random tokens when ``random_non_queries`` (else 0).

    Returns ``(inputs, targets)``: int64 ``(num_examples, seq_len)``. Deterministic in ``seed``.
    Raises ``ValueError`` when the sizes do not fit (names the argument).
    """
    if seq_len < 4 or seq_len % 2:
        raise ValueError(f"data.seq_len must be an even number >= 4 for MQAR, got {seq_len}")
    if num_kv_pairs < 1 or 4 * num_kv_pairs > seq_len:
        raise ValueError(f"data.num_kv_pairs={num_kv_pairs} must be in [1, seq_len/4={seq_len // 4}]")
    key_vocab = vocab_size // 2
    if key_vocab - 1 < num_kv_pairs or vocab_size - key_vocab < num_kv_pairs:
        raise ValueError(f"data.vocab_size={vocab_size} too small for num_kv_pairs={num_kv_pairs} distinct keys/values")
    if power_a <= 0:
        raise ValueError(f"data.power_a must be > 0, got {power_a}")
    g = torch.Generator().manual_seed(int(seed))
    E, P = int(num_examples), int(num_kv_pairs)
    ctx = 2 * P
    # distinct keys / values per example, without an (E, vocab) matrix (Zoology's vocab is 8,192)
    keys = _distinct_ints(E, P, 1, key_vocab, g)  # (E, P) in [1, V/2)
    values = _distinct_ints(E, P, key_vocab, vocab_size, g)  # (E, P) in [V/2, V)
    seq = torch.zeros(E, seq_len + 1, dtype=torch.long)
    seq[:, 0:ctx:2] = keys
    seq[:, 1:ctx:2] = values
    space = (seq_len - ctx) // 2  # query slots at even offsets 0, 2, ... of the query region
    gaps_p = power_a * torch.arange(1, space + 1, dtype=torch.float64) ** (power_a - 1)
    gaps = torch.multinomial(gaps_p.expand(E, space), P, replacement=False, generator=g)  # (E, P) in [0, space)
    qpos = ctx + 2 * gaps  # absolute query positions
    is_query = torch.zeros(E, seq_len + 1, dtype=torch.bool)
    is_query.scatter_(1, qpos, True)
    if random_non_queries:
        filler = torch.randint(0, vocab_size, (E, seq_len + 1), generator=g)
        region = torch.zeros_like(is_query)
        region[:, ctx:] = True
        seq = torch.where(region & ~is_query, filler, seq)
    seq.scatter_(1, qpos, keys)
    # a query token's target (next-token label) is its value; labels[t] = target of inputs[t]
    targets = torch.full((E, seq_len + 1), -100, dtype=torch.long)
    targets.scatter_(1, qpos, values)
    return seq[:, :seq_len].contiguous(), targets[:, :seq_len].contiguous()


MQAR_BYTES_PER_TOKEN = 48
"""Memory bound used by :class:`MQARDataModule`'s size check, bytes per token of ``(num_train + num_val) * seq_len``:
the sets keep int64 inputs and targets (16 bytes a token) and :func:`generate_mqar` peaks at about 46 bytes a token of
the set it is generating (measured on CPU)."""


def mqar_memory_bytes(num_train: int, num_val: int, seq_len: int) -> int:
    """Upper bound of the host memory that generating and keeping the MQAR train and val sets takes."""
    return MQAR_BYTES_PER_TOKEN * (int(num_train) + int(num_val)) * int(seq_len)


class MQARDataModule(L.LightningDataModule):
    """MQAR train / val sets (different seeds), see :func:`generate_mqar`.

    ``vocab_size`` is the model vocabulary; ``bytes_per_token`` is None (no bits-per-byte for MQAR).

    Sizes are checked in the constructor (``ValueError`` naming the argument and its limit): ``seq_len`` even and at
    least ``4 * num_kv_pairs``, ``num_kv_pairs`` distinct keys below ``vocab_size / 2`` and values above it,
    ``num_train >= batch_size`` (training drops a partial last batch, so fewer examples train nothing), and the sets
    must fit in ``max_memory_gb``: :func:`mqar_memory_bytes` (``48 * (num_train + num_val) * seq_len`` bytes) at most
    ``max_memory_gb * 2**30``, i.e. ``seq_len <= max_memory_gb * 2**30 / (48 * (num_train + num_val))``
    (8 GiB: seq_len up to 8520 at the default 20,000 + 1,000 examples).

    :meth:`chance_levels` gives the accuracy of guessing on the query positions.
    """

    def __init__(self, vocab_size: int = 128, seq_len: int = 64, num_kv_pairs: int = 8, num_train: int = 20000,
                 num_val: int = 1000, power_a: float = 0.01, random_non_queries: bool = True, batch_size: int = 64,
                 seed: int = 0, num_workers: int = 0, max_memory_gb: float = 8.0):
        super().__init__()
        self.vocab_size, self.seq_len = _whole("vocab_size", vocab_size), _whole("seq_len", seq_len)
        self.num_kv_pairs = _whole("num_kv_pairs", num_kv_pairs)
        self.num_train, self.num_val = _whole("num_train", num_train), _whole("num_val", num_val)
        self.power_a = float(power_a)
        self.random_non_queries, self.batch_size, self.seed = random_non_queries, _whole("batch_size", batch_size), \
            _whole("seed", seed)
        self.num_workers = _num_workers(num_workers)
        self.max_memory_gb = float(max_memory_gb)
        self.bytes_per_token = None
        if not isinstance(random_non_queries, bool):
            raise ValueError(f"data.random_non_queries must be true or false, got {random_non_queries!r}")
        # validate sizes early (cheap, 1 example)
        generate_mqar(1, self.seq_len, self.vocab_size, self.num_kv_pairs, self.power_a, self.seed)
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {self.batch_size}")
        if self.num_train < self.batch_size:
            raise ValueError(
                f"data.num_train={self.num_train} is smaller than data.batch_size={self.batch_size}: training drops the "
                f"partial last batch, so no step would run; pass data.num_train>={self.batch_size}"
            )
        if self.num_val < 1:
            raise ValueError(f"data.num_val must be >= 1, got {self.num_val}")
        need, budget = mqar_memory_bytes(self.num_train, self.num_val, self.seq_len), self.max_memory_gb * 2**30
        if need > budget:
            longest = int(budget // (MQAR_BYTES_PER_TOKEN * (self.num_train + self.num_val))) // 2 * 2
            raise ValueError(
                f"data.seq_len={self.seq_len} is too long for MQAR with data.num_train={self.num_train} + "
                f"data.num_val={self.num_val} examples: generating them takes about {need / 2**30:.1f} GiB "
                f"({MQAR_BYTES_PER_TOKEN} bytes per token), over data.max_memory_gb={self.max_memory_gb:g}; the longest "
                f"data.seq_len that fits is {longest}. Pass data.seq_len<={longest}, fewer data.num_train examples or "
                f"a larger data.max_memory_gb"
            )
        self.train_set = self.val_set = None

    def chance_levels(self) -> dict:
        """Accuracy of guessing at the query positions (``val/acc`` is measured there).

        ``context``: ``1 / num_kv_pairs``, a model that knows the answer is one of the example's ``num_kv_pairs``
        values (distinct, all in the key-value context) but not which; ``uniform``: ``1 / (vocab_size - vocab_size // 2)``,
        a uniform guess over the value vocabulary (the upper half of the tokens).
        """
        return {"context": 1.0 / self.num_kv_pairs, "uniform": 1.0 / (self.vocab_size - self.vocab_size // 2)}

    def setup(self, stage: Optional[str] = None):
        if self.train_set is not None:
            return
        args = (self.seq_len, self.vocab_size, self.num_kv_pairs, self.power_a)
        self.train_set = BatchedTensorDataset(*generate_mqar(self.num_train, *args, seed=self.seed,
                                                             random_non_queries=self.random_non_queries))
        self.val_set = BatchedTensorDataset(*generate_mqar(self.num_val, *args, seed=self.seed + 1_000_003,
                                                           random_non_queries=self.random_non_queries))

    def train_dataloader(self):
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True,
                          num_workers=self.num_workers, generator=g, collate_fn=collate_batched)

    def val_dataloader(self):
        """The validation examples in order; in DDP each once over the ranks (:func:`val_sampler`)."""
        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
                          collate_fn=collate_batched, sampler=val_sampler(self, self.val_set, "data.num_val"))


# ---------------------------------------------------------------------------------------------------------------
# Packed documents (issue 27 item 1): splitting and packing, used by TextDataModule(pack=True).
_WIKI_ARTICLE = None


def split_documents(text: str, rule: str) -> list:
    """Split a corpus into documents (strings).

    rule: "wikitext" -- an article starts at a line ` = Title = ` (exactly one `=` each side; ` = = Section = = `
    lines are sections and stay inside their article); text before the first title is its own document.
    "blank_line" -- documents are separated by one or more blank lines (Tiny Shakespeare: one speech each).
    "whole" -- the whole text is one document. Raises ValueError naming `rule` and the allowed values.
    """
    import re
    global _WIKI_ARTICLE
    if rule == "whole":
        return [text] if text else []
    if rule == "blank_line":
        return [d for d in re.split(r"\n\s*\n", text) if d.strip()]
    if rule == "wikitext":
        if _WIKI_ARTICLE is None:
            _WIKI_ARTICLE = re.compile(r"^ = [^=](.*[^=])? = $")
        docs, cur = [], []
        for line in text.splitlines(keepends=True):
            if _WIKI_ARTICLE.match(line.rstrip("\n")) and cur:
                docs.append("".join(cur))
                cur = []
            cur.append(line)
        if cur:
            docs.append("".join(cur))
        return [d for d in docs if d.strip()]
    raise ValueError(f"rule must be one of 'wikitext', 'blank_line', 'whole', got {rule!r}")


def pack_documents(docs: Sequence[np.ndarray], seq_len: int, eos: Optional[int] = None) -> dict:
    """Concatenate tokenized documents (each 1-D int array, optionally followed by `eos`) and cut the stream into
    rows of `seq_len + 1` tokens (inputs and shifted targets), documents crossing rows are split there.

    Returns dict with int64 tensors `tokens (R, seq_len + 1)`, `doc_ids (R, seq_len + 1)` (global document index,
    nondecreasing along each row), `positions (R, seq_len + 1)` (position inside the document, restarting at 0),
    and counts `tokens_kept`, `tokens_dropped` (the tail shorter than one row), `docs_kept`, `docs_dropped`
    (documents that lie wholly in the dropped tail or are empty). Nothing is dropped without being counted.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    toks, ids, pos = [], [], []
    n_empty = 0
    for d, doc in enumerate(docs):
        doc = np.asarray(doc, dtype=np.int64)
        if eos is not None:
            doc = np.concatenate([doc, np.array([eos], dtype=np.int64)])
        if doc.size == 0:
            n_empty += 1
            continue
        toks.append(doc)
        ids.append(np.full(doc.size, d, dtype=np.int64))
        pos.append(np.arange(doc.size, dtype=np.int64))
    cat = (lambda xs: np.concatenate(xs)) if toks else (lambda xs: np.zeros(0, dtype=np.int64))
    t, i, p = cat(toks), cat(ids), cat(pos)
    row = seq_len + 1
    rows = t.size // row
    kept = rows * row
    kept_docs = np.unique(i[:kept]).size
    out = {k: torch.from_numpy(a[:kept].reshape(rows, row).copy()) for k, a in (("tokens", t), ("doc_ids", i),
                                                                                 ("positions", p))}
    out.update(tokens_kept=int(kept), tokens_dropped=int(t.size - kept), docs_kept=int(kept_docs),
               docs_dropped=int(len(docs) - kept_docs))
    return out
