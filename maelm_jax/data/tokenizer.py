"""SentencePiece vocabulary with RoBERTa/fairseq's special-id layout, trained once per corpus.

Ids 0..4 are `<s>`, `<pad>`, `</s>`, `<unk>`, `<mask>` (fairseq's dictionary order, so the
model code's constants match RoBERTa's); every other piece has an id >= `FIRST_REGULAR_ID`.

Data hygiene: corpus text never becomes a special id. All four of `<s>`, `<pad>`, `</s>`,
`<mask>` are SentencePiece control symbols, which `encode` never emits, and byte fallback
means `<unk>` never appears either; so a literal "<mask>" in a document is the ordinary
pieces of "<", "mask", ">" and the model never sees the mask id where nothing was masked (the
official pipeline asserts the same). Models trained by older versions, where `<mask>` was a
user-defined symbol that text could produce, are upgraded on load (see `_canonical`). A
person's fill-in-the-blank query goes through `encode_query`, which maps the special tokens'
literal strings to their ids.

Training choices, see `train`:
* unigram LM rather than BPE: SentencePiece's default, the fastest to train from an in-memory
  iterator, and at least as good as BPE for masked-LM pretraining (Bostrom & Durrett, 2020);
* byte fallback: a character outside the vocabulary becomes its UTF-8 bytes, so `<unk>` is
  never produced and any text round-trips;
* `nmt_nfkc` normalization: NFKC plus whitespace cleanup. Ordinary text (single spaces, no
  leading/trailing space, NFKC-stable characters) decodes back exactly; runs of whitespace,
  tabs and newlines become one space, which a masked LM does not need to model.
"""

import hashlib
import io
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Sequence

import sentencepiece as spm
from etils import epath
from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2

from maelm_jax.config import paths
from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import host_cpus

BOS_ID = 0
PAD_ID = 1
EOS_ID = 2
UNK_ID = 3
MASK_ID = 4
FIRST_REGULAR_ID = 5
SPECIAL_PIECES = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0..4
MODEL_FILENAME = "tokenizer.model"

# SentencePiece drops training sentences longer than this many bytes; documents are fed one
# line (paragraph) at a time, so only pathological lines are lost.
_MAX_SENTENCE_BYTES = 1 << 16
_MAX_SENTENCE_CHARS = _MAX_SENTENCE_BYTES // 4  # UTF-8 needs at most 4 bytes a character
_MAX_TRAIN_SENTENCES = 10_000_000  # sampled down to this many if there are more
_PIECE = sentencepiece_model_pb2.ModelProto.SentencePiece
_SPECIAL_TEXT = re.compile("|".join(re.escape(p) for p in SPECIAL_PIECES))


def _canonical(proto: bytes) -> tuple[bytes, bytes, bytes]:
    """(canonical model, its variant without the dummy "▁" prefix, a decoding variant).

    Canonical: ids 0, 1, 2, 4 are CONTROL pieces, so no text encodes to them. Older models
    had `<mask>` as a USER_DEFINED piece (text "<mask>" encoded to its id); this rewrites
    its type, which changes nothing else: ids, scores and every other text's encoding stay.
    The no-prefix variant encodes text that directly follows a special token in a query
    ("<mask>." -> "." rather than "▁."). The decoding variant keeps `<mask>` USER_DEFINED so
    that `decode` shows it as "<mask>" instead of dropping it as it drops control pieces.
    """
    model = sentencepiece_model_pb2.ModelProto()
    try:
        model.ParseFromString(proto)
    except DecodeError as e:
        raise ConfigError(f"not a SentencePiece model ({e})") from None
    pieces = tuple(p.piece for p in model.pieces[: len(SPECIAL_PIECES)])
    if pieces != SPECIAL_PIECES:
        raise ConfigError(
            f"SentencePiece model has special pieces {pieces} at ids 0..4; maelm_jax needs "
            f"{SPECIAL_PIECES} (train one with maelm_jax.data.tokenizer.train)"
        )
    for token_id in (BOS_ID, PAD_ID, EOS_ID, MASK_ID):
        model.pieces[token_id].type = _PIECE.CONTROL
    canonical = model.SerializeToString()
    model.normalizer_spec.add_dummy_prefix = False
    no_prefix = model.SerializeToString()
    model.normalizer_spec.add_dummy_prefix = True
    model.pieces[MASK_ID].type = _PIECE.USER_DEFINED
    return canonical, no_prefix, model.SerializeToString()


class Tokenizer:
    """A loaded SentencePiece model whose special ids are checked against the layout above
    (ConfigError if they differ)."""

    def __init__(self, model_proto: bytes):
        self._proto, no_prefix, decoding = _canonical(bytes(model_proto))
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
            self._sp_no_prefix = spm.SentencePieceProcessor(model_proto=no_prefix)
            self._sp_decode = spm.SentencePieceProcessor(model_proto=decoding)
        except RuntimeError as e:
            raise ConfigError(f"not a SentencePiece model ({e})") from None

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> "Tokenizer":
        """Loads a `.model` file from a local or gs:// path."""
        try:
            return cls(epath.Path(path).read_bytes())
        except ConfigError as e:
            raise ConfigError(f"{os.fspath(path)}: {e}") from None

    def serialized(self) -> bytes:
        """The canonical model's bytes (an older file's `<mask>` upgraded to a control piece):
        a checkpoint stores these to decode without the workdir."""
        return self._proto

    @property
    def fingerprint(self) -> str:
        """sha256 of the model bytes: names data caches that depend on this vocabulary."""
        return hashlib.sha256(self._proto).hexdigest()

    @property
    def vocab_size(self) -> int:
        """Pieces in the model (the model pads its embedding to a multiple of 128 itself)."""
        return self._sp.get_piece_size()

    bos_id = property(lambda self: BOS_ID)
    pad_id = property(lambda self: PAD_ID)
    eos_id = property(lambda self: EOS_ID)
    unk_id = property(lambda self: UNK_ID)
    mask_id = property(lambda self: MASK_ID)
    first_regular_id = property(lambda self: FIRST_REGULAR_ID)
    special_ids = property(lambda self: tuple(range(len(SPECIAL_PIECES))))

    def encode(self, text: str) -> list[int]:
        """Corpus token ids of `text`, without `<s>`/`</s>`; never a special id (ids >=
        `FIRST_REGULAR_ID` only): special tokens' literal strings are ordinary text here."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 0) -> list[list[int]]:
        """`encode` over many texts using SentencePiece's own threads (0: every usable CPU)."""
        return self._sp.encode(list(texts), num_threads=num_threads or host_cpus.usable_cpus())

    def encode_query(self, text: str) -> list[int]:
        """Token ids of a person's query, without `<s>`/`</s>` added: the literal strings
        "<s>", "<pad>", "</s>", "<unk>", "<mask>" become their ids, as in a HuggingFace
        tokenizer's added special tokens; the text between them is encoded as corpus text.

        Whitespace around a special token: a section's trailing whitespace is dropped (like
        RoBERTa's `<mask>` with lstrip), and a section that follows a special token gets
        SentencePiece's word-start "▁" only if it starts with whitespace (HuggingFace's
        Metaspace `prepend_scheme="first"`). So "It is <mask>." gives the pieces of "It is",
        then `<mask>`, then "." exactly as the corpus encodes "It is Paris." around "▁Paris".
        """
        ids: list[int] = []
        start = 0
        for match in _SPECIAL_TEXT.finditer(text):
            ids += self._encode_section(text[start : match.start()], first=start == 0)
            ids.append(SPECIAL_PIECES.index(match.group()))
            start = match.end()
        return ids + self._encode_section(text[start:], first=start == 0)

    def _encode_section(self, text: str, first: bool) -> list[int]:
        if first or text[:1].isspace():
            return self._sp.encode(text)
        return self._sp_no_prefix.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; `<s>`, `<pad>` and `</s>` decode to nothing, `<mask>` to "<mask>"."""
        return self._sp_decode.decode([int(i) for i in ids])

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))


def _sentences(texts: Iterable[str]) -> Iterator[str]:
    """Non-empty lines of the documents: SentencePiece trains on sentences, not documents.

    A line longer than _MAX_SENTENCE_CHARS (one enormous line makes SentencePiece's trainer
    fail inside C++) is cut into pieces of that many characters, at the last space before
    the limit where there is one; the pieces are trained on like any other lines.
    """
    for text in texts:
        for line in text.splitlines():
            while len(line) > _MAX_SENTENCE_CHARS:
                cut = line.rfind(" ", 0, _MAX_SENTENCE_CHARS) + 1 or _MAX_SENTENCE_CHARS
                if line[:cut].strip():
                    yield line[:cut]
                line = line[cut:]
            if line.strip():
                yield line


def train(texts: Iterable[str], vocab_size: int) -> bytes:
    """Trains a unigram SentencePiece model on `texts` (documents) and returns its bytes.

    `vocab_size` is an upper bound: a corpus with fewer distinct pieces yields a smaller
    vocabulary instead of failing. Raises ConfigError when there is no text, or when
    `vocab_size` cannot hold the 5 special pieces, 256 byte pieces and the text's characters.
    """
    sentences = _sentences(texts)
    first = next(sentences, None)
    if first is None:
        raise ConfigError("no text to train the tokenizer on: the documents are all empty")
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], sentences),
            model_writer=writer,
            model_type="unigram",
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            bos_id=BOS_ID,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            control_symbols=["<mask>"],  # text never encodes to it: see the module docstring
            byte_fallback=True,
            normalization_rule_name="nmt_nfkc",
            character_coverage=0.9995,
            split_digits=True,
            max_sentence_length=_MAX_SENTENCE_BYTES,
            input_sentence_size=_MAX_TRAIN_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=host_cpus.usable_cpus(),
            minloglevel=2,
        )
    except RuntimeError as e:
        needed = re.search(r"\d+ vs (\d+)", str(e))
        if "smaller than required" in str(e) and needed:
            raise ConfigError(
                f"vocab_size={vocab_size} is too small for this corpus: it needs at least "
                f"{needed.group(1)} pieces (5 special, 256 bytes, and its characters)"
            ) from None
        raise
    return writer.getvalue()


def from_vocab_path(vocab_path: str) -> Tokenizer:
    """The tokenizer a config's `vocab_path` names; ConfigError unless it is a model file."""
    path = paths.path(vocab_path)
    if not path.exists():
        raise ConfigError(
            f"vocab_path={vocab_path!r} does not exist; give a SentencePiece .model "
            "file, or leave vocab_path unset to train one"
        )
    if path.is_dir() or path.stat().length == 0:
        raise ConfigError(
            f"vocab_path={vocab_path!r} is "
            f"{'a directory' if path.is_dir() else 'an empty file'}; give a SentencePiece "
            ".model file, or leave vocab_path unset to train one"
        )
    return Tokenizer.from_path(path)
