"""SQuAD's core: the official files read, windows and span labels through a real fast
tokenizer (the project's SentencePiece one, and a RoBERTa-style byte-level BPE with trimmed
offsets), decoding on constructed logits, and each rule of the official evaluations against a
hand-computed case."""

import json
import math
import time

import numpy as np
import pytest
from offline import refusing_proxy

from maelm_jax.config.run_config import ConfigError
from maelm_jax.squad import decoding, features, outputs, reading, scoring
from maelm_jax.squad.reading import VERSIONS, Answer, Example, SquadDataError

V2, V1 = VERSIONS["squad_v2"], VERSIONS["squad_v1"]

CAFE = (
    "Zoë's café «Le Petit Déjeuner» — the oldest in the quarter — opened in 1887 in Paris "
    "near the Seine. Its owner Łukasz Nowak baked bread every morning before dawn."
)
LIGHTHOUSE = (
    "The lighthouse on the northern cape was built from grey granite in 1821. Its lamp burned "
    "whale oil until the harbour board bought a paraffin burner. Keepers lived in a cottage "
    "beside the tower with their families and goats. In winter the supply boat came once a "
    "month if the sea allowed it. The last keeper Margarethe Olsen left when the light was "
    "automated in 1968. Today the cottage is a small museum that opens every summer."
)
QUERY = 8  # max_query_length in the window tests: every question here is longer


def qa(id_, question, context, *answers, impossible=False):
    return {
        "id": id_,
        "question": question,
        "answers": [{"text": a, "answer_start": context.index(a)} for a in answers],
        "is_impossible": impossible,
    }


def squad_json(extra_qas=()) -> dict:
    """An official-format 2.0 file: unicode before answers, several gold answers, an
    unanswerable question, and a context that spans three windows."""
    cafe = [
        qa(
            "year",
            "When did the café first open its doors?",
            CAFE,
            "1887",
            "in 1887",
            "1887 in Paris",
        ),
        qa("city", "In which city is the café found?", CAFE, "Paris"),
        qa("owner", "Who owned the café in those days?", CAFE, "Łukasz Nowak"),
        qa("none", "Who owns the bakery next door to it?", CAFE, impossible=True),
    ]
    light = [
        qa("built", "When was the lighthouse on the cape built?", LIGHTHOUSE, "1821"),
        qa("boat", "How often did the supply boat come?", LIGHTHOUSE, "once a month"),
        qa("keeper", "Who was the very last keeper there?", LIGHTHOUSE, "Margarethe Olsen"),
        qa("museum", "What is the old cottage used as today?", LIGHTHOUSE, "a small museum"),
        qa("nobody", "Who painted the tower red and white?", LIGHTHOUSE, impossible=True),
        *extra_qas,
    ]
    paragraphs = [{"context": CAFE, "qas": cafe}, {"context": LIGHTHOUSE, "qas": light}]
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}


def write_squad(folder, version, split, document):
    folder.mkdir(exist_ok=True)
    path = folder / version.file_name(split)
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("squad")
    write_squad(folder, V2, "dev", squad_json())
    return reading.read(V2, "dev", squad_dir=folder)


def _sentencepiece():
    from maelm_jax.data import tokenizer as tok
    from maelm_jax.hf.tokenizer import hf_tokenizer

    texts = [
        CAFE,
        LIGHTHOUSE,
        *(q["question"] for p in squad_json()["data"][0]["paragraphs"] for q in p["qas"]),
    ]
    return hf_tokenizer(tok.Tokenizer(tok.train(texts, 400)), 512)


def _byte_level_bpe():
    """RoBERTa's kind: byte-level BPE, a prefix space, offsets trimmed of spaces."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=True, trim_offsets=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator([CAFE, LIGHTHOUSE] * 4, vocab_size=400, special_tokens=specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        cls_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        sep_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


@pytest.fixture(scope="module", params=["sentencepiece", "byte_level_bpe"])
def tokenizer(request):
    return {"sentencepiece": _sentencepiece, "byte_level_bpe": _byte_level_bpe}[request.param]()


@pytest.fixture(scope="module")
def shape(tokenizer):
    """(seq_len, doc_stride) that cut LIGHTHOUSE into exactly three windows."""
    tokens = len(tokenizer(LIGHTHOUSE, add_special_tokens=False)["input_ids"])
    room = math.ceil(tokens / 2)
    return QUERY + features.SPECIAL_TOKENS + room, math.ceil((tokens - room) / 2)


@pytest.fixture(scope="module")
def built(examples, tokenizer, shape):
    return features.build(examples, tokenizer, *shape, max_query_length=QUERY)


def windows_of(built, index):
    return np.flatnonzero(built.example_index == index)


def label_text(built, example, w):
    first, _ = built.char_span(w, built.start_positions[w])
    _, last = built.char_span(w, built.end_positions[w])
    return example.context[first:last].strip()


# -- reading -------------------------------------------------------------------------------


def test_the_official_layout_reads_into_questions(examples):
    by_id = {e.id: e for e in examples}
    assert len(examples) == 9 and list(by_id)[:2] == ["year", "city"]
    year = by_id["year"]
    assert year.context == CAFE and year.question == "When did the café first open its doors?"
    assert [a.text for a in year.answers] == ["1887", "in 1887", "1887 in Paris"]
    assert year.answers[0] == Answer("1887", CAFE.index("1887")) and not year.is_impossible
    assert by_id["none"].is_impossible and by_id["none"].answers == ()
    assert not by_id["none"].has_answer and by_id["owner"].has_answer


def test_squad_1_1_files_need_no_is_impossible(tmp_path):
    document = squad_json()
    for p in document["data"][0]["paragraphs"]:
        p["qas"] = [{k: v for k, v in q.items() if k != "is_impossible"} for q in p["qas"]]
        p["qas"] = [q for q in p["qas"] if q["answers"]]
    write_squad(tmp_path, V1, "train", document)
    examples = reading.read(V1, "train", squad_dir=tmp_path)
    assert len(examples) == 7 and not any(e.is_impossible for e in examples)


def test_an_answer_not_at_its_answer_start_is_counted_not_fatal(tmp_path, caplog):
    moved = qa("moved", "Where did the keepers live then?", LIGHTHOUSE, "a cottage")
    moved["answers"][0]["answer_start"] += 2
    path = write_squad(tmp_path, V2, "dev", squad_json([moved]))
    with caplog.at_level("WARNING"):
        examples = reading.read(V2, "dev", squad_dir=tmp_path)
    assert examples[-1].id == "moved"
    assert f"{path}: 1 of 10 answers' text does not sit at its answer_start" in caplog.text


def test_tfds_questions_convert_from_bytes():
    example = reading.from_tfds(
        {
            "id": b"q1",
            "question": "Où?".encode(),
            "context": "à Paris".encode(),
            "answers": {"text": np.array([b"Paris"]), "answer_start": np.array([2], np.int32)},
            "is_impossible": np.bool_(False),
        }
    )
    assert example == Example("q1", "Où?", "à Paris", (Answer("Paris", 2),), False)


BAD_FILES = {
    "not JSON": (b'{"data": [', "not a JSON file (JSONDecodeError"),
    "not UTF-8": (b'{"data": "caf\xe9"}', "not a JSON file (UnicodeDecodeError"),
    "no data": (b'{"version": "v2.0"}', "has no `data` list"),
    "no paragraphs": (b'{"data": [{"title": "x"}]}', "data[0] has no 'paragraphs'"),
    "no id": (
        json.dumps(
            {
                "data": [
                    {"paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": []}]}]}
                ]
            }
        ).encode(),
        "data[0].paragraphs[0].qas[0] has no 'id'",
    ),
    "start outside": (
        json.dumps(
            {"data": [{"paragraphs": [{"context": "abc", "qas": [qa("q", "?", "abc", "b")]}]}]}
        )
        .encode()
        .replace(b'"answer_start": 1', b'"answer_start": 9'),
        "answers[0] has answer_start 9, outside its context's 3 characters",
    ),
    "a duplicate id": (
        json.dumps(
            {"data": [{"paragraphs": [{"context": "abc", "qas": [qa("q", "?", "abc", "b")] * 2}]}]}
        ).encode(),
        "question id 'q' appears twice",
    ),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_one_line_naming_it(tmp_path, case):
    content, message = BAD_FILES[case]
    path = tmp_path / V2.file_name("dev")
    path.write_bytes(content)
    with pytest.raises(SquadDataError) as raised:
        reading.read(V2, "dev", squad_dir=tmp_path)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(f"{path}: ") and message in str(raised.value)
    assert path.read_bytes() == content  # read, never repaired in place


def test_a_missing_split_or_folder_is_one_line_naming_the_files(tmp_path):
    write_squad(tmp_path, V2, "train", squad_json())
    with pytest.raises(SquadDataError, match=r"dev-v2\.0\.json: no such file; SQuAD 2\.0 needs"):
        reading.read(V2, "dev", squad_dir=tmp_path)
    with pytest.raises(SquadDataError, match=r"train-v1\.1\.json and dev-v1\.1\.json"):
        reading.read(V1, "train", squad_dir=tmp_path / "nowhere")
    with pytest.raises(SquadDataError, match="unknown split 'validation'; allowed: train, dev"):
        reading.read(V2, "validation", squad_dir=tmp_path)


def test_tfds_squad_without_a_network_fails_in_seconds_naming_squad_dir(tmp_path, monkeypatch):
    """As GLUE's TFDS reads do: an unprepared dataset with no way out stops at once."""
    with refusing_proxy(monkeypatch):
        start = time.monotonic()
        with pytest.raises(SquadDataError) as raised:
            reading.read(V2, "dev", tfds_data_dir=str(tmp_path / "tfds"))
        seconds = time.monotonic() - start
    message = str(raised.value)
    assert seconds < 30 and "\n" not in message
    assert message.startswith("TFDS squad/v2.0 (validation) could not be loaded")
    assert "with --squad_dir (needs train-v2.0.json and dev-v2.0.json)" in message


# -- features ------------------------------------------------------------------------------


def test_windows_are_the_papers_layout_with_only_the_context_cut(examples, built, tokenizer, shape):
    seq_len, stride = shape
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for index, example in enumerate(examples):
        question = tokenizer(example.question, add_special_tokens=False)["input_ids"][:QUERY]
        context = tokenizer(example.context, add_special_tokens=False)["input_ids"]
        starts = []
        for w in windows_of(built, index):
            offset, start = built.context_offset[w], built.window_start[w]
            length = int(built.attention_mask[w].sum()) - offset - 1
            assert offset == 1 + QUERY + 2  # every question here has more than QUERY tokens
            row = built.input_ids[w].tolist()
            assert row[:offset] == [cls, *question, sep, sep]
            assert row[offset : offset + length] == context[start : start + length]
            assert row[offset + length] == sep
            assert row[offset + length + 1 :] == [tokenizer.pad_token_id] * (
                seq_len - offset - length - 1
            )
            expected = np.zeros(seq_len, bool)
            expected[0] = True
            expected[offset : offset + length] = True
            assert built.scoreable[w].tolist() == expected.tolist()  # question, specials: out
            starts.append((start, length))
        assert starts[-1][0] + starts[-1][1] == len(context)  # the last window reaches the end
        assert [s for s, _ in starts] == [i * stride for i in range(len(starts))]
    assert len(windows_of(built, 5)) == 3  # LIGHTHOUSE's questions span three windows


def test_span_labels_point_at_the_answer_or_at_index_0(examples, built):
    for index, example in enumerate(examples):
        windows = windows_of(built, index)
        labelled = [w for w in windows if built.start_positions[w] != 0]
        if example.is_impossible:
            assert labelled == [] and (built.end_positions[windows] == 0).all()
            continue
        assert labelled, f"{example.id}: no window labels its answer"
        for w in labelled:
            assert label_text(built, example, w) == example.answers[0].text
        w = labelled[0]
        first = built.start_positions[w] - built.context_offset[w] + built.window_start[w]
        last = built.end_positions[w] - built.context_offset[w] + built.window_start[w]
        for w in set(windows) - set(labelled):  # a window without the whole answer: index 0
            start, length = built.window_start[w], int(built.scoreable[w].sum()) - 1
            assert not start <= first <= last < start + length
            assert built.end_positions[w] == 0


def test_answers_at_and_across_a_windows_edge(examples, built, tokenizer, shape):
    """An answer ending on the first window's last context token is labelled there and in the
    second window; one running a token past it, only in the second (index 0 in the first)."""
    w0 = windows_of(built, 5)[0]
    last = int(built.scoreable[w0].sum()) - 2  # window 0's last context token, in the context
    (a, b), (_, c) = built.spans[5][last], built.spans[5][last + 1]
    assert LIGHTHOUSE[a:b].strip() and LIGHTHOUSE[b:c].strip(), "pick another LIGHTHOUSE"

    def answer(first, end):
        text = LIGHTHOUSE[first:end].strip()
        start = LIGHTHOUSE.index(text, first)
        return Example("edge", examples[5].question, LIGHTHOUSE, (Answer(text, start),), False)

    at_edge, across = answer(a, b), answer(a, c)
    labels = features.build([at_edge, across], tokenizer, *shape, max_query_length=QUERY)
    edge = built.context_offset[w0] + last
    assert labels.start_positions[0] == labels.end_positions[0] == edge
    assert labels.start_positions[1] != 0
    assert (
        label_text(labels, at_edge, 0) == label_text(labels, at_edge, 1) == at_edge.answers[0].text
    )
    first, second = windows_of(labels, 1)[:2]
    assert labels.start_positions[first] == labels.end_positions[first] == 0
    assert label_text(labels, across, second) == across.answers[0].text


def test_each_context_token_has_its_most_context_in_exactly_one_window(examples, built):
    for index in (0, 5):
        windows = windows_of(built, index)
        tokens = len(built.spans[index])
        owners = np.zeros(tokens, int)
        best = {}
        for w in windows:
            offset, start = built.context_offset[w], built.window_start[w]
            length = int(built.scoreable[w].sum()) - 1
            owners[start : start + length] += built.max_context[w, offset : offset + length]
            assert not built.max_context[w, :offset].any()
            for i in range(length):
                score = min(i, length - 1 - i) + 0.01 * length
                if score > best.get(start + i, (-1, None))[0]:
                    best[start + i] = (score, w)
        assert owners.tolist() == [1] * tokens
        for token, (_, w) in best.items():
            position = built.context_offset[w] + token - built.window_start[w]
            assert built.max_context[w, position]


def test_a_short_export_gets_windows_of_its_length_with_the_stride_scaled(caplog):
    with caplog.at_level("INFO"):
        assert features.window_shape(128) == (128, 43)
    assert "the export has 128 positions, fewer than SQuAD's 384: windows of 128" in caplog.text
    assert features.window_shape(514) == (384, 128)
    assert features.window_shape(128, max_seq_length=96) == (96, 32)
    assert features.window_shape(128, max_seq_length=100, doc_stride=7) == (100, 7)
    with pytest.raises(ConfigError, match="max_seq_length=256 is more than the export's 128"):
        features.window_shape(128, max_seq_length=256)
    with pytest.raises(ConfigError, match=r"leaves no context .* allowed: at least 69"):
        features.window_shape(512, max_seq_length=68)
    with pytest.raises(ConfigError, match="doc_stride=0"):
        features.window_shape(512, doc_stride=0)


def test_a_slow_tokenizer_is_refused_in_one_line(examples):
    with pytest.raises(ConfigError, match="is not a fast tokenizer; SQuAD's span labels need"):
        features.build(examples, object())


# -- decoding ------------------------------------------------------------------------------

WORDS = "alpha beta gamma delta epsilon zeta"


def hand_features() -> tuple[Example, features.Features]:
    """WORDS as six tokens in two windows of four, `<s> q q </s></s> c c c c </s>`: tokens 0-3
    at positions 5-8 of window 0, tokens 2-5 of window 1. Token 2 (gamma) has its most context
    in window 0 (min(2, 1) against min(0, 3)), token 3 (delta) in window 1."""
    example = Example("q", "?", WORDS, (Answer("gamma delta", 12),), False)
    starts = [WORDS.index(w) for w in WORDS.split()]
    spans = np.array([(s, s + len(w)) for s, w in zip(starts, WORDS.split(), strict=True)])
    scoreable = np.zeros((2, 10), bool)
    scoreable[:, [0, 5, 6, 7, 8]] = True
    max_context = np.zeros((2, 10), bool)
    max_context[0, [5, 6, 7]] = True
    max_context[1, [6, 7, 8]] = True
    return example, features.Features(
        input_ids=np.zeros((2, 10), np.int32),
        attention_mask=np.ones((2, 10), np.int32),
        start_positions=np.zeros(2, np.int32),
        end_positions=np.zeros(2, np.int32),
        scoreable=scoreable,
        max_context=max_context,
        example_index=np.zeros(2, np.int32),
        context_offset=np.array([5, 5], np.int32),
        window_start=np.array([0, 2], np.int32),
        spans=(spans,),
    )


def hand_logits():
    start, end = np.zeros((2, 10)), np.zeros((2, 10))
    start[0, 0], end[0, 0] = 3, 3  # window 0's null score: 6
    start[1, 0], end[1, 0] = 1, 1  # window 1's: 2, the question's null score (the least)
    start[0, 2], end[0, 8] = 9, 6  # a start in the question: never a candidate
    start[0, 7] = 5  # gamma in window 0, its most context: gamma delta scores 5 + 6 = 11
    start[0, 8] = 8  # delta in window 0, not its most context: 8 + 6 = 14 is refused
    end[0, 6] = 6.5  # beta: before gamma, so (gamma, beta) = 11.5 is refused
    start[1, 6], end[1, 6] = 4, 3  # delta in window 1: 7
    return start, end


def test_decoding_takes_the_best_span_the_rules_allow():
    example, built = hand_features()
    start, end = hand_logits()
    predictions, null_odds = decoding.decode([example], built, start, end, with_null=True)
    assert predictions == {"q": "gamma delta"}
    assert null_odds == {"q": 2 - 11}  # the least null over the windows, less the best span
    short, _ = decoding.decode([example], built, start, end, True, max_answer_length=1)
    assert short == {"q": "delta"}  # gamma delta is two tokens; delta alone, in window 1
    v1, none = decoding.decode([example], built, start, end, with_null=False)
    assert v1 == {"q": "gamma delta"} and none == {}


def test_null_wins_only_above_the_threshold():
    example, built = hand_features()
    start, end = hand_logits()
    for gap, expected in ((1.5, ""), (1.0, "gamma delta"), (0.5, "gamma delta")):
        start[:, 0] = end[:, 0] = (11 + gap) / 2  # null = 11 + gap in both windows
        predictions, null_odds = decoding.decode([example], built, start, end, with_null=True)
        assert predictions == {"q": expected} and null_odds["q"] == pytest.approx(gap)
    loose, _ = decoding.decode([example], built, start, end, True, null_threshold=-1.0)
    assert loose == {"q": ""}  # HuggingFace's run_qa.py threshold is 0.0


def test_a_question_with_no_candidate_answers_empty():
    example, built = hand_features()
    start, end = hand_logits()
    start[:, 0] = 20  # the only start in the 1-best of each window is index 0
    predictions, null_odds = decoding.decode([example], built, start, end, True, n_best=1)
    assert predictions == {"q": ""} and null_odds == {"q": 20 + 1 - 0.0}


def test_labels_decode_back_to_the_gold_answers(examples, built, tmp_path):
    """Logits that peak on each window's labels decode to every answerable question's first
    gold answer, and to "" for the rest: offsets, labels and decoding agree, with no
    off-by-one, for both tokenizers; eval.json then scores 100."""
    start = np.zeros(built.input_ids.shape)
    end = np.zeros(built.input_ids.shape)
    rows = np.arange(len(built))
    start[rows, built.start_positions] = 10
    end[rows, built.end_positions] = 10
    predictions, null_odds = decoding.decode(examples, built, start, end, with_null=True)
    expected = {e.id: e.answers[0].text if e.answers else "" for e in examples}
    assert predictions == expected
    assert all(null_odds[e.id] == (20 if e.is_impossible else -20) for e in examples)
    result = outputs.write(tmp_path, V2, examples, predictions, null_odds)
    assert result["exact"] == result["f1"] == 100.0 and result["total"] == 9
    assert (result["HasAns_total"], result["NoAns_total"]) == (7, 2)
    assert json.loads((tmp_path / "predictions.json").read_text(encoding="utf-8")) == expected
    assert json.loads((tmp_path / "eval.json").read_text()) == result


# -- scoring -------------------------------------------------------------------------------


def test_normalization_lowercases_strips_punctuation_and_articles():
    assert scoring.normalize_answer("  The Quick,  brown (fox)! ") == "quick brown fox"
    assert scoring.normalize_answer("An apple a day; theatre") == "apple day theatre"
    assert scoring.normalize_answer("Zoë's «café»") == "zoës «café»"  # ASCII punctuation only


def test_token_f1_and_exact_match():
    assert scoring.f1("the cat sat on the mat", "cat on mat") == pytest.approx(6 / 7)
    assert scoring.f1("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)  # counted overlap
    assert scoring.exact("The Broncos!", "broncos") == 1
    assert scoring.f1("", "") == 1.0 and scoring.f1("", "Paris") == 0.0


def gold(id_, *answers):
    return Example(id_, "?", "c", tuple(Answer(a, 0) for a in answers), not answers)


def test_the_best_gold_answer_counts_and_empty_golds_are_dropped():
    examples = [
        gold("many", "Paris", "in Paris, France"),
        gold("the", "The", "Paris"),  # "The" normalizes to nothing: only "Paris" is gold
        gold("empty", "a", "!"),  # all normalize to nothing: [""] stands in
    ]
    predictions = {"many": "Paris France", "the": "", "empty": ""}
    result = scoring.evaluate_v2(examples, predictions)
    # many: EM 0; F1 max(2/3 against "Paris", 4/5 against "in Paris France") = 0.8
    assert result["exact"] == pytest.approx(100 * (0 + 0 + 1) / 3)
    assert result["f1"] == pytest.approx(100 * (0.8 + 0 + 1) / 3)
    assert "best_exact" not in result  # the official script's output without --na-prob-file


def test_the_na_prob_threshold_and_the_best_threshold():
    examples = [
        gold("q1", "Paris"),
        gold("q2", "1887"),
        gold("q3"),
        gold("q4"),
        gold("q5", "Seine"),
    ]
    predictions = {"q1": "Paris", "q2": "in 1887", "q3": "Seine", "q4": "", "q5": "the Seine river"}
    na_probs = {"q1": 0.5, "q2": 1.0, "q3": 1.2, "q4": 0.9, "q5": 1.5}
    result = scoring.evaluate_v2(examples, predictions, na_probs)
    # only above 1.0 (q2's 1.0 is not) q3 and q5 count as "no answer": q3 right, q5 wrong
    assert result == pytest.approx(
        {
            "exact": 100 * 3 / 5,
            "f1": 100 * (1 + 2 / 3 + 1 + 1 + 0) / 5,
            "total": 5,
            "HasAns_exact": 100 / 3,
            "HasAns_f1": 100 * (1 + 2 / 3) / 3,
            "HasAns_total": 3,
            "NoAns_exact": 100.0,
            "NoAns_f1": 100.0,
            "NoAns_total": 2,
            # from all "no answer" (2 right), answer q1 (+1), q4 (0), q2 (+0 EM, +2/3 F1),
            # q3 (-1), q5 (+0 EM, +2/3 F1): EM peaks at 3 after q1, F1 at 3 2/3 after q2
            "best_exact": 100 * 3 / 5,
            "best_exact_thresh": 0.5,
            "best_f1": 100 * (3 + 2 / 3) / 5,
            "best_f1_thresh": 1.0,
        }
    )
    assert list(result)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def test_squad_1_1_has_its_own_rules():
    examples = [gold("a", "Denver Broncos", "The Broncos"), gold("b", "!"), gold("c", "1887")]
    result = scoring.evaluate_v1(examples, {"a": "broncos", "b": ""})
    # b: "" against "" is an exact match, but 1.1's F1 of no tokens is 0; c: missing, 0
    assert result == pytest.approx({"exact_match": 100 * 2 / 3, "f1": 100 / 3})


# -- outputs -------------------------------------------------------------------------------


def test_squad_1_1_writes_predictions_and_eval_only(tmp_path):
    examples = [gold("a", "Paris"), gold("b", "1887")]
    result = outputs.write(tmp_path, V1, examples, {"a": "Paris", "b": "1888"}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "predictions.json"]
    assert result == {"exact_match": 50.0, "f1": 50.0}
    assert json.loads((tmp_path / "eval.json").read_text()) == result


def test_every_question_needs_a_prediction(tmp_path):
    examples = [gold("a", "Paris"), gold("b")]
    with pytest.raises(ValueError, match=r"1 of 2 questions have no prediction .*'b'"):
        outputs.write(tmp_path, V2, examples, {"a": "Paris", "b": ""}, {"a": -3.0})
    assert list(tmp_path.iterdir()) == []
