"""The SentencePiece wrapper: special-id layout, exact round trips, training once per corpus
and reuse."""

import io

import pytest
import sentencepiece as spm

from configs import default
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import prepared
from maelm_jax.data import tokenizer as tok
from maelm_jax.data.input_pipeline import load_tokenizer

TEXTS = [
    "The river runs past the old mill and under the stone bridge.",
    "A quiet morning settled over the harbor while the boats waited.",
    "She wrote a letter to her brother about the winter garden.",
    "Every evening the lantern keeper climbed the narrow stairs.",
    "Children played near the meadow until the light grew soft.",
    "The library kept its rarest books behind a glass door.\nNobody had opened it for years.",
    "Music drifted from the window of the house on the hill.",
    "They walked along the road, talking about the weather and the harvest.",
    "In 1887 the town built a school, a post office and a small theatre.",
    "The teacher asked why the moon looks larger near the horizon.",
]
VOCAB = 400


@pytest.fixture(scope="module")
def model() -> bytes:
    return tok.train(TEXTS, VOCAB)


def data(config):
    """The run's DataConfig, as `train_and_evaluate` hands it to the tokenizer."""
    return configdict.freeze(config).data


@pytest.fixture
def config():
    c = default.get_config()
    c.vocab_size = VOCAB
    c.tokenizer_train_documents = 1000
    return c


@pytest.mark.parametrize(
    "text",
    [
        TEXTS[0],
        "Zebras quickly vex the jumpy wizard, who owes them 42 apples.",
        "A naïve café serves crème brûlée — for €3.50!",
        "Unseen words like xylophone and quizzical still survive.",
    ],
)
def test_ordinary_text_round_trips_exactly_without_unk(model, text):
    t = tok.Tokenizer(model)
    ids = t.encode(text)
    assert t.decode(ids) == text
    assert tok.UNK_ID not in ids
    assert min(ids) >= tok.FIRST_REGULAR_ID


def test_special_ids_follow_fairseq_order(model):
    t = tok.Tokenizer(model)
    assert [t.id_to_piece(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert (t.bos_id, t.pad_id, t.eos_id, t.unk_id, t.mask_id) == (0, 1, 2, 3, 4)
    assert (tok.BOS_ID, tok.PAD_ID, tok.EOS_ID, tok.UNK_ID, tok.MASK_ID) == (0, 1, 2, 3, 4)
    assert t.first_regular_id == tok.FIRST_REGULAR_ID == 5
    assert t.special_ids == (0, 1, 2, 3, 4)
    assert 300 < t.vocab_size <= VOCAB


SPECIAL_TEXT = "Keep <mask> and <s> then </s> or <pad>, even <unk>: <mask>."


def _old_style_model() -> bytes:
    """A model as older versions trained it: `<mask>` a user-defined piece, which text
    encodes to its id."""
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS),
        model_writer=writer,
        vocab_size=VOCAB,
        hard_vocab_limit=False,
        bos_id=0,
        pad_id=1,
        eos_id=2,
        unk_id=3,
        user_defined_symbols=["<mask>"],
        byte_fallback=True,
        normalization_rule_name="nmt_nfkc",
        minloglevel=2,
    )
    proto = writer.getvalue()
    assert 4 in spm.SentencePieceProcessor(model_proto=proto).encode("a <mask> b")
    return proto


@pytest.mark.parametrize("kind", ["current", "older"])
def test_corpus_text_never_yields_special_ids(model, kind):
    t = tok.Tokenizer(model if kind == "current" else _old_style_model())
    for ids in [t.encode(SPECIAL_TEXT), *t.encode_batch([SPECIAL_TEXT, "<mask><s></s>"])]:
        assert min(ids) >= tok.FIRST_REGULAR_ID
    assert t.decode(t.encode(SPECIAL_TEXT)) == SPECIAL_TEXT


def test_older_model_is_upgraded_without_changing_other_text():
    proto = _old_style_model()
    old = spm.SentencePieceProcessor(model_proto=proto)
    t = tok.Tokenizer(proto)
    assert all(t.encode(text) == old.encode(text) for text in TEXTS)
    assert tok.MASK_ID not in tok.Tokenizer(t.serialized()).encode("a <mask> b")


def test_encode_query_maps_special_strings_to_their_ids(model):
    t = tok.Tokenizer(model)
    ids = t.encode_query(SPECIAL_TEXT)
    specials = [i for i in ids if i < tok.FIRST_REGULAR_ID]
    assert specials == [tok.MASK_ID, tok.BOS_ID, tok.EOS_ID, tok.PAD_ID, tok.UNK_ID, tok.MASK_ID]
    assert t.encode_query("the river") == t.encode("the river")
    assert t.encode_query("<mask>") == [tok.MASK_ID]


def test_encode_query_mask_stands_where_a_word_was(model):
    t = tok.Tokenizer(model)
    # The corpus encodes "...the river." as [..., "▁river", "."]; a query that masks the
    # word must give the same ids around it, with no stray "▁" before "." or after "the".
    sentence = t.encode("Every evening the river.")
    word = t.encode("river")
    assert sentence[-1 - len(word) : -1] == word
    query = t.encode_query("Every evening the <mask>.")
    assert query == [*sentence[: -1 - len(word)], tok.MASK_ID, *sentence[-1:]]
    assert t.encode_query("the <mask> runs") == [*t.encode("the"), tok.MASK_ID, *t.encode("runs")]
    assert "<mask>" in t.decode(query)
    assert t.decode([tok.BOS_ID, *t.encode("the river"), tok.EOS_ID, tok.PAD_ID]) == "the river"


def test_serialized_model_reloads_identically(model, tmp_path):
    t = tok.Tokenizer(model)
    again = tok.Tokenizer(t.serialized())
    path = tmp_path / "copy.model"
    path.write_bytes(t.serialized())
    from_file = tok.Tokenizer.from_path(path)
    for other in (again, from_file):
        assert other.serialized() == model
        assert other.fingerprint == t.fingerprint
        assert other.vocab_size == t.vocab_size
        assert other.encode(TEXTS[5]) == t.encode(TEXTS[5])


@pytest.fixture
def corpus_config(config, tmp_path):
    """`config` reading TEXTS from a text file, its corpus prepared under tmp_path/data."""
    (tmp_path / "texts.txt").write_text("\n\n".join(TEXTS) + "\n")
    config.dataset = f"text:{tmp_path}/texts.txt"
    config.data_dir = str(tmp_path / "data")
    config.eval_holdout_fraction = 0.0
    config.eval_batches = 0
    return config


@pytest.fixture
def train_calls(monkeypatch):
    """The number of documents each tokenizer training read (the real training)."""
    calls, real = [], tok.train

    def counted(texts, vocab_size):
        texts = list(texts)
        calls.append(len(texts))
        return real(texts, vocab_size)

    monkeypatch.setattr(tok, "train", counted)
    return calls


def test_the_corpus_tokenizer_is_trained_once_and_a_workdir_keeps_its_copy(
    corpus_config, train_calls, tmp_path
):
    first = load_tokenizer(data(corpus_config), tmp_path / "work")
    assert train_calls == [len(TEXTS)]
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [tok.MODEL_FILENAME]
    own = prepared.tokenizer_path(data(corpus_config))
    assert own.read_bytes() == (tmp_path / "work" / tok.MODEL_FILENAME).read_bytes()
    second = load_tokenizer(data(corpus_config), tmp_path / "other_work")  # copied, not trained
    assert train_calls == [len(TEXTS)] and second.serialized() == first.serialized()
    own.unlink()  # a resumed run needs only its workdir's copy
    resumed = load_tokenizer(data(corpus_config), tmp_path / "work")
    assert train_calls == [len(TEXTS)] and resumed.serialized() == first.serialized()


def test_the_tokenizer_reads_at_most_tokenizer_train_documents(
    corpus_config, train_calls, tmp_path
):
    corpus_config.tokenizer_train_documents = 4
    t = load_tokenizer(data(corpus_config), tmp_path / "work")
    assert train_calls == [4]
    assert t.decode(t.encode(TEXTS[1])) == TEXTS[1]


def test_vocab_path_is_used_as_given(corpus_config, model, train_calls, tmp_path):
    path = tmp_path / "given.model"
    path.write_bytes(model)
    corpus_config.vocab_path = str(path)
    t = load_tokenizer(data(corpus_config), tmp_path / "workdir")
    assert t.serialized() == model and train_calls == []
    assert not (tmp_path / "workdir").exists() and not (tmp_path / "data").exists()


def test_missing_vocab_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nowhere\.model"):
        tok.from_vocab_path(str(tmp_path / "nowhere.model"))


def test_vocab_path_that_is_not_a_model_is_a_config_error(config, tmp_path):
    config.vocab_path = str(tmp_path / "junk.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(ConfigError, match=r"junk\.model: not a SentencePiece model"):
        load_tokenizer(data(config), tmp_path / "work")


def test_too_small_vocab_is_a_config_error():
    with pytest.raises(ConfigError, match="vocab_size=100"):
        tok.train(TEXTS, 100)


def test_empty_corpus_is_a_config_error():
    with pytest.raises(ConfigError, match="no text"):
        tok.train(["", "  \n "], VOCAB)


def test_model_with_another_id_layout_is_rejected():
    writer = io.BytesIO()  # SentencePiece's defaults: <unk>=0, <s>=1, </s>=2
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS), model_writer=writer, vocab_size=100, minloglevel=2
    )
    with pytest.raises(ConfigError, match="special pieces"):
        tok.Tokenizer(writer.getvalue())
