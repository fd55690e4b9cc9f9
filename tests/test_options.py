"""ElmoOptions: bilm-tf's options.json both ways, with errors that name the field."""
import json

import pytest

from elmo_jax import ElmoOptions, OptionsError

BILM_TF_TRAIN_OPTIONS = {  # as bilm-tf's bin/train_elmo.py writes them
    "bidirectional": True,
    "char_cnn": {"activation": "relu", "embedding": {"dim": 16},
                 "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                 "max_characters_per_token": 50, "n_characters": 261, "n_highway": 2},
    "dropout": 0.1,
    "lstm": {"cell_clip": 3, "dim": 4096, "n_layers": 2, "proj_clip": 3,
             "projection_dim": 512, "use_skip_connections": True},
    "all_clip_norm_val": 10.0, "n_epochs": 10, "n_train_tokens": 768648884,
    "batch_size": 128, "n_tokens_vocab": 793471, "unroll_steps": 20,
    "n_negative_samples_batch": 8192,
}


def test_json_round_trip(tmp_path):
    d = dict(BILM_TF_TRAIN_OPTIONS, sample_softmax=True)
    (tmp_path / "o.json").write_text(json.dumps(d))
    o = ElmoOptions.from_json(tmp_path / "o.json")
    assert o.lstm.dim == 4096 and o.char_cnn.embedding_dim == 16
    assert o.char_cnn.n_filters == 2048 and o.output_dim == 1024
    o.to_json(tmp_path / "back.json")
    assert json.loads((tmp_path / "back.json").read_text()) == d
    assert hash(o) == hash(ElmoOptions.from_json(tmp_path / "back.json"))


def test_fixture_options_load(fixture_dir):
    o = ElmoOptions.from_json(f"{fixture_dir}/options.json")
    assert o.lstm.use_skip_connections is False and o.n_output_layers == 3


@pytest.mark.parametrize("section,field,value,needle", [
    ("lstm", "dim", 0, "'lstm.dim'"),
    ("lstm", "cell_clip", -1, "'lstm.cell_clip'"),
    ("lstm", "use_skip_connections", "yes", "'lstm.use_skip_connections'"),
    ("char_cnn", "activation", "gelu", "'char_cnn.activation'"),
    ("char_cnn", "n_characters", 300, "'char_cnn.n_characters'"),
    ("char_cnn", "filters", [[0, 3]], "'char_cnn.filters'"),
    ("char_cnn", "filters", "wide", "'char_cnn.filters'"),
    ("lstm", "dimm", 3, "'lstm.dimm'"),
    (None, "dropout", 1.5, "'dropout'"),
])
def test_errors_name_the_field(section, field, value, needle):
    d = json.loads(json.dumps(BILM_TF_TRAIN_OPTIONS))
    (d[section] if section else d)[field] = value
    with pytest.raises(OptionsError, match=needle):
        ElmoOptions.from_dict(d)


def test_missing_pieces(tmp_path):
    d = json.loads(json.dumps(BILM_TF_TRAIN_OPTIONS))
    del d["char_cnn"]["embedding"]
    with pytest.raises(OptionsError, match="char_cnn.embedding.dim"):
        ElmoOptions.from_dict(d)
    with pytest.raises(OptionsError, match="missing section 'lstm'"):
        ElmoOptions.from_dict({"char_cnn": {}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(OptionsError, match="bad.json: not valid JSON"):
        ElmoOptions.from_json(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        ElmoOptions.from_json(tmp_path / "missing.json")


def test_every_bilm_tf_training_option_is_kept_and_unknown_ones_warned(tmp_path):
    d = dict(BILM_TF_TRAIN_OPTIONS, learning_rate=0.1, sample_softmax=False)
    o = ElmoOptions.from_dict(d)
    assert (o.learning_rate, o.sample_softmax, o.n_epochs) == (0.1, False, 10)
    with pytest.warns(UserWarning, match="not used here: warmup, lr_schedule"):
        o = ElmoOptions.from_dict(dict(d, warmup=3, lr_schedule="cosine"))
    assert dict(o.extra) == {"warmup": "3", "lr_schedule": '"cosine"'}
    with pytest.raises(OptionsError, match="sample_softmax"):
        ElmoOptions.from_dict(dict(d, sample_softmax="no"))
