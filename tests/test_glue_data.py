"""GLUE's readers on small files in GLUE's exact layout, and its metrics on cases checked by
hand. The fixtures copy the quirks of GLUE's download: no quoting (literal, unbalanced `"`),
CoLA without a header, SST-2's trailing spaces, MNLI's wider dev files, MRPC's BOM."""

import math
import time
import warnings

import numpy as np
import pytest
from offline import refusing_proxy

from maelm_jax.config.run_config import ConfigError
from maelm_jax.glue import metrics, readers
from maelm_jax.glue.readers import Example, GlueDataError
from maelm_jax.glue.tasks import TASKS

STSB_HEADER = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
)
MNLI_PARSES = "( ( A b ) )\t( B )\t(ROOT (S a))\t(ROOT (S b))"
MNLI_TRAIN_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)
MNLI_DEV_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\t"
    "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"
)


def write_glue(root, task_dir, split, lines, newline="\n", final_newline=True):
    """Writes `<root>/<task_dir>/<split>.tsv` byte for byte; returns its path."""
    folder = root / task_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{split}.tsv"
    text = newline.join(lines) + (newline if final_newline and lines else "")
    path.write_bytes(text.encode("utf-8"))
    return path


def glue_message(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message  # one line
    assert isinstance(excinfo.value, ConfigError)
    return message


# ---------------------------------------------------------------------------- metrics


def test_classification_metrics_match_hand_computed_values():
    assert metrics.metric("accuracy", [1, 0, 1, 1], [1, 0, 0, 1]) == 0.75
    # Class 1 positive: TP 1, FP 2, FN 1 -> P 1/3, R 1/2, F1 0.4 (class 0 would give 4/7).
    assert metrics.metric("f1", [1, 1, 1, 0, 0, 0], [1, 0, 0, 1, 0, 0]) == pytest.approx(0.4)
    # TP 3, FN 2, TN 2, FP 1: (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)).
    mcc = (3 * 2 - 1 * 2) / math.sqrt(4 * 5 * 3 * 4)
    got = metrics.metric("matthews", [1, 1, 1, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 0, 0, 0])
    assert got == pytest.approx(mcc)


def test_correlations_pearson_is_linear_spearman_is_rank():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    assert metrics.metric("pearson", 2 * x + 1, x) == pytest.approx(1.0)
    assert metrics.metric("pearson", -x, x) == pytest.approx(-1.0)
    assert metrics.metric("spearman", x**3, x) == pytest.approx(1.0)
    assert metrics.metric("pearson", x**3, x) < 0.95


def test_a_constant_prediction_scores_zero_correlation_not_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("pearson", "spearman"):
            assert metrics.metric(name, [2.5] * 4, [0.0, 1.0, 4.0, 5.0]) == 0.0
    assert metrics.metric("matthews", [1] * 4, [0, 1, 0, 1]) == 0.0


def test_split_metrics_are_the_tasks_metrics():
    mrpc = metrics.split_metrics(TASKS["mrpc"], np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]))
    assert mrpc == pytest.approx({"f1": 2 / 3, "accuracy": 0.75})
    stsb = metrics.split_metrics(TASKS["stsb"], [0.5, 1.0, 4.0], [0.0, 2.0, 5.0])
    assert set(stsb) == {"pearson", "spearman"} and stsb["spearman"] == pytest.approx(1.0)


def test_task_score_averages_metrics_and_mnlis_dev_sets_in_points():
    assert metrics.task_score(TASKS["mrpc"], {"dev": {"f1": 0.9, "accuracy": 0.8}}) == (
        pytest.approx(85.0)
    )
    mnli = {"dev_matched": {"accuracy": 0.8}, "dev_mismatched": {"accuracy": 0.9}}
    assert metrics.task_score(TASKS["mnli"], mnli) == pytest.approx(85.0)
    with pytest.raises(ValueError, match="dev_mismatched"):
        metrics.task_score(TASKS["mnli"], {"dev_matched": {"accuracy": 0.8}})
    assert metrics.glue_score({"mrpc": 85.0, "mnli": 80.0, "cola": 60.0}) == pytest.approx(75.0)


# ---------------------------------------------------------------------------- readers


def test_cola_is_headerless_and_keeps_literal_unbalanced_quotes(tmp_path):
    # The first row is an example (no header); an unbalanced quote must not swallow the next
    # rows, as a csv reader with quoting would; GLUE's dev.tsv has no final newline.
    write_glue(
        tmp_path,
        "CoLA",
        "dev",
        [
            'l-93\t1\t\tSusan whispered "Shut up".',
            'r-67\t0\t*\t"He said hello.',
            "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.",
            "ad03\t0\t?*\tWho did you say that left?",
        ],
        final_newline=False,
    )
    assert readers.read_glue_file(TASKS["cola"], tmp_path, "dev") == [
        Example('Susan whispered "Shut up".', None, 1),
        Example('"He said hello.', None, 0),
        Example("The sailors rode the breeze clear of the rocks.", None, 1),
        Example("Who did you say that left?", None, 0),
    ]


def test_sst2_keeps_text_as_written_and_tolerates_crlf_and_blank_lines(tmp_path):
    lines = ["sentence\tlabel", "it 's a charming and often affecting journey . \t1"]
    lines += ["unflinchingly bleak and desperate \t0", "", 'a quote : " \t0', ""]
    write_glue(tmp_path, "SST-2", "train", lines, newline="\r\n")
    assert readers.read(TASKS["sst2"], "train", glue_dir=tmp_path) == [
        Example("it 's a charming and often affecting journey . ", None, 1),
        Example("unflinchingly bleak and desperate ", None, 0),
        Example('a quote : " ', None, 0),
    ]


@pytest.mark.parametrize(
    "task_name, task_dir, header, row, expected",
    [
        (
            "rte",
            "RTE",
            "index\tsentence1\tsentence2\tlabel",
            '0\t"Yet," he said, "no.\tBacteria win.\tnot_entailment',
            Example('"Yet," he said, "no.', "Bacteria win.", 1),
        ),
        (
            "mrpc",  # GLUE's download copies the BOM of Microsoft's file into the header
            "MRPC",
            "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , he said .",
            Example("Amrozi accused his brother .", "Referring to him , he said .", 1),
        ),
        (
            "qqp",
            "QQP",
            "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            "7\t15\t16\tHow do I read?\tHow can I read?\t1",
            Example("How do I read?", "How can I read?", 1),
        ),
        (
            "qnli",
            "QNLI",
            "index\tquestion\tsentence\tlabel",
            "0\tWhat came first?\tThe egg came first.\tentailment",
            Example("What came first?", "The egg came first.", 0),
        ),
    ],
)
def test_pair_tasks_read_text_and_label_by_header_name(
    tmp_path, task_name, task_dir, header, row, expected
):
    write_glue(tmp_path, task_dir, "dev", [header, row])
    assert readers.read_glue_file(TASKS[task_name], tmp_path, "dev") == [expected]


def test_stsb_reads_float_scores_from_its_ten_columns(tmp_path):
    rows = [
        "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man dances.\tA man dances.\t5.000",
        '1\tmain-news\theadlines\t2015\t0001\tnone\tnone\tA "b\tC\t0.00',
        "2\tmain-forums\tans\t2016\t0002\tnone\tnone\tOne.\tTwo.\t3.8",
        "3\tmain-forums\tans\t2016\t0003\tnone\tnone\tThree.\tFour.\t0",
    ]
    write_glue(tmp_path, "STS-B", "train", [STSB_HEADER, *rows])
    examples = readers.read_glue_file(TASKS["stsb"], tmp_path, "train")
    assert [(e.text_a, e.text_b) for e in examples] == [
        ("A man dances.", "A man dances."),
        ('A "b', "C"),
        ("One.", "Two."),
        ("Three.", "Four."),
    ]
    assert [e.label for e in examples] == [5.0, 0.0, 3.8, 0.0]
    assert all(isinstance(e.label, float) for e in examples)


def test_mnli_reads_train_and_both_dev_sets_by_gold_label(tmp_path):
    write_glue(
        tmp_path,
        "MNLI",
        "train",
        [MNLI_TRAIN_HEADER, f"0\t1\t1n\tgov\t{MNLI_PARSES}\tTrain a.\tTrain b.\tneutral\tneutral"],
    )
    # label1 differs from gold_label, so reading the wrong column shows.
    for split, genre, gold, label_id in (
        ("dev_matched", "fiction", "contradiction", 2),
        ("dev_mismatched", "letters", "entailment", 0),
    ):
        row = f"0\t2\t2c\t{genre}\t{MNLI_PARSES}\t{split} a.\t{split} b.\tneutral\t"
        row += f"neutral\t{gold}\t{gold}\t{gold}\t{gold}"
        write_glue(tmp_path, "MNLI", split, [MNLI_DEV_HEADER, row])
        assert readers.read_glue_file(TASKS["mnli"], tmp_path, split) == [
            Example(f"{split} a.", f"{split} b.", label_id)
        ]
    train = readers.read_glue_file(TASKS["mnli"], tmp_path, "train")
    assert train == [Example("Train a.", "Train b.", 1)]


def test_tfds_splits_are_glue_files_renamed():
    assert TASKS["mnli"].tfds_split("dev_mismatched") == "validation_mismatched"
    assert TASKS["mnli"].tfds_split("dev_matched") == "validation_matched"
    assert TASKS["rte"].tfds_split("dev") == "validation"
    assert TASKS["rte"].tfds_split("train") == "train"


def test_from_tfds_converts_bytes_and_numpy_labels():
    qnli = readers.from_tfds(
        TASKS["qnli"],
        {"question": b"Why?", "sentence": b"Because.", "label": np.int64(1), "idx": 3},
    )
    assert qnli == Example("Why?", "Because.", 1) and type(qnli.label) is int
    cola = readers.from_tfds(TASKS["cola"], {"sentence": b"Hi.", "label": np.int64(0), "idx": 0})
    assert cola == Example("Hi.", None, 0)
    stsb = readers.from_tfds(
        TASKS["stsb"], {"sentence1": b"a", "sentence2": b"b", "label": np.float32(3.5), "idx": 0}
    )
    assert stsb == Example("a", "b", 3.5) and type(stsb.label) is float
    assert set(readers.TFDS_FEATURES) == set(TASKS)


# ---------------------------------------------------------------------------- bad input


def test_missing_glue_dir_and_missing_file_name_the_path_and_the_files_needed(tmp_path):
    missing = tmp_path / "no_glue"
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["rte"], missing, "train")
    assert str(missing) in glue_message(excinfo)

    write_glue(tmp_path, "STS-B", "train", [STSB_HEADER])
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["stsb"], tmp_path, "dev")
    message = glue_message(excinfo)
    assert str(tmp_path / "STS-B" / "dev.tsv") in message
    assert "STS-B/train.tsv and STS-B/dev.tsv" in message
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["mnli"], tmp_path, "dev_matched")
    assert "MNLI/train.tsv, MNLI/dev_matched.tsv and MNLI/dev_mismatched.tsv" in (
        glue_message(excinfo)
    )
    with pytest.raises(GlueDataError, match=r"'dev_matched'.*allowed: train, dev"):
        readers.read_glue_file(TASKS["rte"], tmp_path, "dev_matched")


def test_a_header_without_a_needed_column_names_it_and_the_header(tmp_path):
    path = write_glue(
        tmp_path, "RTE", "dev", ["index\tsentence1\tsentence2\tgold", "0\ta\tb\tentailment"]
    )
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["rte"], tmp_path, "dev")
    message = glue_message(excinfo)
    assert str(path) in message and "'label'" in message
    assert "index, sentence1, sentence2, gold" in message


@pytest.mark.parametrize(
    "task_name, task_dir, lines, bad_line",
    [
        ("sst2", "SST-2", ["sentence\tlabel", "good .\t1", "a\ttab inside .\t0"], 3),
        ("sst2", "SST-2", ["sentence\tlabel", "no label ."], 2),
        ("cola", "CoLA", ["gj04\t1\t\tFine.", "gj04\t1\tToo few."], 2),
        ("rte", "RTE", ["index\tsentence1\tsentence2\tlabel", "", "0\ta\tb\tentailment\t"], 3),
    ],
)
def test_a_row_with_the_wrong_field_count_names_its_line(
    tmp_path, task_name, task_dir, lines, bad_line
):
    path = write_glue(tmp_path, task_dir, "train", lines)
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS[task_name], tmp_path, "train")
    assert f"{path}: line {bad_line} has" in glue_message(excinfo)


def test_a_label_outside_the_tasks_set_names_it_and_the_allowed_ones(tmp_path):
    header = "index\tsentence1\tsentence2\tlabel"
    path = write_glue(tmp_path, "RTE", "dev", [header, "0\ta\tb\tentailment", "1\ta\tb\tmaybe"])
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["rte"], tmp_path, "dev")
    message = glue_message(excinfo)
    assert f"{path}: line 3" in message and "'maybe'" in message
    assert "entailment, not_entailment" in message
    write_glue(tmp_path, "SST-2", "dev", ["sentence\tlabel", "fine .\t2"])
    with pytest.raises(GlueDataError, match=r"line 2: label '2'.*allowed: 0, 1"):
        readers.read_glue_file(TASKS["sst2"], tmp_path, "dev")


@pytest.mark.parametrize("score", ["high", "7.5", "-0.5", "nan", ""])
def test_a_bad_stsb_score_names_the_value_and_the_range(tmp_path, score):
    row = f"0\tg\tf\ty\t0\tnone\tnone\tOne.\tTwo.\t{score}"
    path = write_glue(tmp_path, "STS-B", "dev", [STSB_HEADER, row])
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["stsb"], tmp_path, "dev")
    message = glue_message(excinfo)
    assert f"{path}: line 2" in message and repr(score) in message and "0 to 5" in message


@pytest.mark.parametrize(
    "task_name, task_dir, lines",
    [
        ("rte", "RTE", []),
        ("rte", "RTE", ["index\tsentence1\tsentence2\tlabel"]),
        ("cola", "CoLA", []),
        ("cola", "CoLA", ["", ""]),
    ],
)
def test_a_file_without_examples_is_an_error(tmp_path, task_name, task_dir, lines):
    path = write_glue(tmp_path, task_dir, "train", lines)
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS[task_name], tmp_path, "train")
    message = glue_message(excinfo)
    assert str(path) in message and ("empty" in message or "no examples" in message)


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_bytes(b"sentence\tlabel\nfine .\t1\ncaf\xe9 .\t0\n")
    with pytest.raises(GlueDataError) as excinfo:
        readers.read_glue_file(TASKS["sst2"], tmp_path, "train")
    assert f"{path}: line 3 is not UTF-8" in glue_message(excinfo)


def test_from_tfds_refuses_unlabeled_test_rows_and_bad_labels():
    features = {"sentence1": b"a", "sentence2": b"b", "idx": 0}
    with pytest.raises(GlueDataError) as excinfo:
        readers.from_tfds(TASKS["rte"], {**features, "label": np.int64(-1)})
    assert "glue/rte" in glue_message(excinfo) and "-1" in str(excinfo.value)
    with pytest.raises(GlueDataError, match="label id 3"):
        readers.from_tfds(TASKS["mnli"], {**features, "label": np.int64(3)})
    with pytest.raises(GlueDataError, match="lacks feature"):
        readers.from_tfds(TASKS["qnli"], {**features, "label": np.int64(0)})


def test_tfds_glue_builders_reach_their_download(tmp_path):
    """`finetune`'s default data, TFDS's `glue/<task>`, finds its download checksums next to
    its code through `importlib_resources`, which TFDS 4.9 imports but does not declare
    (setup.py installs it). Without it every task failed before downloading anything."""
    import tensorflow_datasets as tfds

    builder = tfds.builder("glue/cola", data_dir=str(tmp_path))
    assert builder.code_path.name == "glue.py"
    assert "https://dl.fbaipublicfiles.com/glue/data/CoLA.zip" in builder.url_infos


def test_tfds_glue_without_a_network_fails_in_seconds_naming_glue_dir(tmp_path, monkeypatch):
    """A task TFDS has not prepared needs its download; with no way out (HTTPS only through a
    proxy that refuses), the read stops at once with the line that names --glue_dir, where
    TFDS's own ten retries with backoff took 3.5 minutes to give up (issue 64)."""
    with refusing_proxy(monkeypatch):
        start = time.monotonic()
        with pytest.raises(GlueDataError) as raised:
            readers.read(TASKS["rte"], "train", tfds_data_dir=str(tmp_path / "tfds"))
        seconds = time.monotonic() - start
    message = str(raised.value)
    assert seconds < 30, f"{seconds:.0f} s to fail offline"
    assert "\n" not in message and "TFDS glue/rte (train)" in message
    assert "with --glue_dir (needs RTE/train.tsv and RTE/dev.tsv)" in message
