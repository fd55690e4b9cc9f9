"""ElmoOptions: bilm-tf's `options.json` as a frozen, hashable dataclass.

The JSON layout is bilm-tf's (and AllenNLP's):

    {"lstm": {"dim", "projection_dim", "n_layers", "cell_clip", "proj_clip",
              "use_skip_connections"},
     "char_cnn": {"activation", "embedding": {"dim"}, "filters", "n_highway",
                  "n_characters", "max_characters_per_token"},
     "bidirectional", "dropout", "n_tokens_vocab", "n_negative_samples_batch",
     "batch_size", "unroll_steps", "n_epochs", "n_train_tokens", "all_clip_norm_val"}

Options are hashable so that `jax.jit(embed, static_argnames="options")` can key
its compilation cache on them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings

from elmo_jax.errors import UserError
from elmo_jax.storage.files import read_json, write_json

# The character-row rule, here and nowhere else: bilm-tf trains with 261
# character ids (0..260) and its training options say so; inference files (what
# bilm-tf's dump and AllenNLP read) say 262 because the loader prepends a zero row
# for the padding id 0. Both describe the same table: the model keeps 262 rows
# (row 0 is padding), the weight file stores the 261 real ones.
TRAINING_CHARACTERS = 261
INFERENCE_CHARACTERS = 262
CHAR_TABLE_ROWS = INFERENCE_CHARACTERS      # rows of the model's char embedding
STORED_CHAR_ROWS = TRAINING_CHARACTERS      # rows of `char_embed` in a weight file
_N_CHARACTERS_ALLOWED = (TRAINING_CHARACTERS, INFERENCE_CHARACTERS)
_ACTIVATIONS = ("relu", "tanh")


class OptionsError(UserError, ValueError):
    """An options.json that cannot describe a biLM; the message names the field."""


@dataclasses.dataclass(frozen=True)
class LSTMOptions:
    """The "lstm" section: each direction's stack of LSTMs with projection.

    Attributes:
        dim: D, the cells of each LSTM.
        projection_dim: P, each LSTM's output after its projection (and the
            token vectors' width).
        n_layers: L, LSTM layers per direction.
        cell_clip: the cells are clipped to [-cell_clip, cell_clip]; None:
            not clipped.
        proj_clip: the projections likewise.
        use_skip_connections: the residual connection from layer 1's input
            to its output (between layer 1 and layer 2), as bilm-tf's.
    """
    dim: int = 4096
    projection_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True


@dataclasses.dataclass(frozen=True)
class CharCNNOptions:
    """The "char_cnn" section: the token encoder.

    Attributes:
        activation: the convolutions' ("relu" or "tanh").
        embedding_dim: each character's vector ("embedding": {"dim": ...}
            in the JSON).
        filters: (width, count) of each convolution.
        n_highway: highway layers after the max over positions.
        n_characters: rows of the character table: 261 (training files)
            or 262 (inference files) for UTF-8 spelling, the same table.
        max_characters_per_token: C, ids per token, the marks included.
        spelling: "utf8": bilm-tf's UTF-8 bytes; "lexicon": characters
            looked up in a dictionary (ELMoForManyLangs, `lexicon.py`).
        word_dim: > 0: a word table of n_words rows, read beside the
            characters (a lexicon model).
        n_words: that table's rows.
    """
    activation: str = "relu"
    embedding_dim: int = 16
    filters: tuple[tuple[int, int], ...] = (
        (1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    n_highway: int = 2
    n_characters: int = 262
    max_characters_per_token: int = 50
    spelling: str = "utf8"
    word_dim: int = 0
    n_words: int = 0

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def widest_filter(self) -> int:
        return max(w for w, _ in self.filters)

    @property
    def table_rows(self) -> int:
        """Rows of the model's character table (row 0: the padding token)."""
        return CHAR_TABLE_ROWS if self.spelling == "utf8" else self.n_characters

    @property
    def ids_per_token(self) -> int:
        """Ids that spell one token: its characters, and its word id last when
        the model reads a word embedding."""
        return self.max_characters_per_token + (1 if self.word_dim else 0)


@dataclasses.dataclass(frozen=True)
class ElmoOptions:
    """Every field of bilm-tf's options.json. Model fields are nested as in the
    JSON (`options.lstm.dim`); training fields sit at the top level, and every
    one of them is used by training here. Top-level fields that bilm-tf does not
    know are named in one warning and kept, in order and JSON-encoded, in
    `extra` so that a file round-trips.

    Attributes:
        lstm: the `LSTMOptions`.
        char_cnn: the `CharCNNOptions`.
        bidirectional: must be true (a biLM).
        dropout: training's dropout rate on each LSTM layer's input and the
            top layer's output.
        n_tokens_vocab: the softmax's rows (the vocabulary's words).
        n_negative_samples_batch: negatives the sampled softmax draws per
            step (log-uniform).
        batch_size: rows a step, over all devices.
        unroll_steps: tokens a row a step (truncated backpropagation; the
            state carries over).
        n_epochs: passes over the corpus (with n_train_tokens, the run's
            steps when train.max_steps is None).
        n_train_tokens: the corpus's tokens.
        all_clip_norm_val: the gradients' global-norm clip.
        learning_rate: bilm-tf's Adagrad rate; None: the config's
            train.learning_rate.
        sample_softmax: False: train with the full softmax; None: sampled.
        extra: fields bilm-tf does not know, (name, JSON) pairs in order.
    """

    lstm: LSTMOptions = LSTMOptions()
    char_cnn: CharCNNOptions = CharCNNOptions()
    bidirectional: bool = True
    dropout: float = 0.1
    n_tokens_vocab: int | None = None
    n_negative_samples_batch: int = 8192
    batch_size: int = 128
    unroll_steps: int = 20
    n_epochs: int = 10
    n_train_tokens: int | None = None
    all_clip_norm_val: float = 10.0
    learning_rate: float | None = None
    sample_softmax: bool | None = None
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        _validate(self)

    # -- JSON ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict) -> "ElmoOptions":
        if not isinstance(d, dict):
            raise OptionsError(f"options must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        for section in ("lstm", "char_cnn"):
            if section not in d:
                raise OptionsError(f"options: missing section '{section}'")
            if not isinstance(d[section], dict):
                raise OptionsError(f"options: '{section}' must be an object")
        lstm_d = dict(d.pop("lstm"))
        cnn_d = dict(d.pop("char_cnn"))
        lstm = _build(LSTMOptions, lstm_d, "lstm")
        emb = cnn_d.pop("embedding", None)
        if not isinstance(emb, dict) or "dim" not in emb:
            raise OptionsError("options: missing field 'char_cnn.embedding.dim'")
        cnn_d["embedding_dim"] = emb["dim"]
        if "filters" in cnn_d:
            try:
                cnn_d["filters"] = tuple((int(w), int(n)) for w, n in cnn_d["filters"])
            except (TypeError, ValueError):
                raise OptionsError(
                    "options: 'char_cnn.filters' must be a list of [width, count] pairs, "
                    f"got {cnn_d['filters']!r}") from None
        char_cnn = _build(CharCNNOptions, cnn_d, "char_cnn")
        known = {f.name for f in dataclasses.fields(cls)} - {"lstm", "char_cnn", "extra"}
        top = {k: d.pop(k) for k in list(d) if k in known}
        extra = tuple((k, json.dumps(v)) for k, v in d.items())
        if extra:
            warnings.warn(f"options: field(s) that bilm-tf does not define, not used here: "
                          f"{', '.join(k for k, _ in extra)} (kept when the options are "
                          "written back)", stacklevel=2)
        return cls(lstm=lstm, char_cnn=char_cnn, extra=extra, **top)

    def to_dict(self) -> dict:
        lstm = dataclasses.asdict(self.lstm)
        cnn = dataclasses.asdict(self.char_cnn)
        cnn["embedding"] = {"dim": cnn.pop("embedding_dim")}
        cnn["filters"] = [list(f) for f in self.char_cnn.filters]
        if self.char_cnn.spelling == "utf8":  # bilm-tf's own fields only
            for name in ("spelling", "word_dim", "n_words"):
                del cnn[name]
        out = {"lstm": lstm, "char_cnn": cnn}
        for f in dataclasses.fields(self):
            if f.name not in ("lstm", "char_cnn", "extra"):
                value = getattr(self, f.name)
                if value is not None:
                    out[f.name] = value
        out.update({k: json.loads(v) for k, v in self.extra})
        return out

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "ElmoOptions":
        """Read bilm-tf's options.json.

        Args:
            path: the file (local or in a bucket).

        Returns:
            The `ElmoOptions` it states.

        Raises:
            OptionsError: a missing or unreadable file, or a field out of
                range or of the wrong type; names the file and the field.
        """
        d = read_json(path, "options file", OptionsError)
        try:
            return cls.from_dict(d)
        except OptionsError as e:
            raise OptionsError(f"{path}: {e}") from None

    def to_json(self, path: str | os.PathLike) -> None:
        """Write these options as bilm-tf's options.json (read back unchanged,
        `extra` fields included; the file appears whole or not at all).

        Args:
            path: the file to write (local or in a bucket).
        """
        write_json(path, self.to_dict())

    def replace(self, **changes) -> "ElmoOptions":
        return dataclasses.replace(self, **changes)

    def for_inference(self) -> "ElmoOptions":
        """These options as an inference file states them (n_characters 262)."""
        if self.char_cnn.spelling != "utf8":
            return self
        return self.replace(char_cnn=dataclasses.replace(self.char_cnn,
                                                         n_characters=INFERENCE_CHARACTERS))

    def network(self) -> "ElmoOptions":
        """The network alone, the jit key of `embed` (two files of one network
        share one program).

        Returns:
            `ElmoOptions` with this LSTM and character CNN as an inference
            file states them (n_characters 262) and every training field at
            its default.
        """
        return ElmoOptions(lstm=self.lstm, char_cnn=self.for_inference().char_cnn)

    def same_model(self, other: "ElmoOptions") -> bool:
        """Whether two options describe one network (weights of one fit the other).

        Args:
            other: the options to compare with.

        Returns:
            True when the LSTM and character CNN agree (n_characters 261 and
            262 are the same table; training fields do not matter).
        """
        return (self.lstm, self.for_inference().char_cnn) == (other.lstm,
                                                             other.for_inference().char_cnn)

    # -- derived sizes --------------------------------------------------------
    @property
    def output_dim(self) -> int:
        """Width of one layer of `embed`'s output: forward and backward halves."""
        return 2 * self.lstm.projection_dim

    @property
    def n_output_layers(self) -> int:
        """Token layer plus one per LSTM layer."""
        return self.lstm.n_layers + 1


def _build(klass, d: dict, prefix: str):
    names = {f.name for f in dataclasses.fields(klass)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise OptionsError(f"options: unknown field '{prefix}.{unknown[0]}'")
    return klass(**d)


def _check(cond: bool, field: str, msg: str):
    if not cond:
        raise OptionsError(f"options: '{field}' {msg}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _validate(o: ElmoOptions) -> None:
    l, c = o.lstm, o.char_cnn
    _check(isinstance(l, LSTMOptions), "lstm", "must be an LSTMOptions")
    _check(isinstance(c, CharCNNOptions), "char_cnn", "must be a CharCNNOptions")
    for name in ("dim", "projection_dim", "n_layers"):
        v = getattr(l, name)
        _check(_is_int(v) and v > 0, f"lstm.{name}", f"must be a positive integer, got {v!r}")
    for name in ("cell_clip", "proj_clip"):
        v = getattr(l, name)
        _check(v is None or (_is_num(v) and v > 0), f"lstm.{name}",
               f"must be a positive number or null, got {v!r}")
    _check(isinstance(l.use_skip_connections, bool), "lstm.use_skip_connections",
           f"must be true or false, got {l.use_skip_connections!r}")
    _check(c.activation in _ACTIVATIONS, "char_cnn.activation",
           f"must be one of {_ACTIVATIONS}, got {c.activation!r}")
    _check(_is_int(c.embedding_dim) and c.embedding_dim > 0, "char_cnn.embedding.dim",
           f"must be a positive integer, got {c.embedding_dim!r}")
    _check(isinstance(c.filters, tuple) and len(c.filters) > 0, "char_cnn.filters",
           "must be a non-empty list of [width, count] pairs")
    for w, n in c.filters:
        _check(_is_int(w) and _is_int(n) and w > 0 and n > 0, "char_cnn.filters",
               f"has an invalid pair [{w}, {n}]: width and count must be positive")
        _check(w <= c.max_characters_per_token, "char_cnn.filters",
               f"has width {w} wider than max_characters_per_token "
               f"{c.max_characters_per_token}")
    _check(_is_int(c.n_highway) and c.n_highway >= 0, "char_cnn.n_highway",
           f"must be a non-negative integer, got {c.n_highway!r}")
    _check(c.spelling in ("utf8", "lexicon"), "char_cnn.spelling",
           f"must be 'utf8' or 'lexicon', got {c.spelling!r}")
    if c.spelling == "utf8":
        _check(c.n_characters in _N_CHARACTERS_ALLOWED, "char_cnn.n_characters",
               f"must be 261 (training) or 262 (inference), got {c.n_characters!r}")
        _check(c.word_dim == 0, "char_cnn.word_dim",
               "must be 0 with UTF-8 spelling (a word table needs a lexicon)")
    else:
        _check(_is_int(c.n_characters) and c.n_characters >= 7, "char_cnn.n_characters",
               f"must be an integer >= 7 with a lexicon, got {c.n_characters!r}")
        _check(_is_int(c.word_dim) and c.word_dim >= 0, "char_cnn.word_dim",
               f"must be a non-negative integer, got {c.word_dim!r}")
        _check(c.word_dim == 0 or (_is_int(c.n_words) and c.n_words >= 5), "char_cnn.n_words",
               f"must be an integer >= 5 with a word table, got {c.n_words!r}")
    _check(_is_int(c.max_characters_per_token) and c.max_characters_per_token >= 3,
           "char_cnn.max_characters_per_token",
           f"must be an integer >= 3, got {c.max_characters_per_token!r}")
    _check(isinstance(o.bidirectional, bool), "bidirectional", "must be true or false")
    _check(o.bidirectional, "bidirectional",
           "must be true: elmo-jax builds bidirectional language models only")
    _check(_is_num(o.dropout) and 0.0 <= o.dropout < 1.0, "dropout",
           f"must be in [0, 1), got {o.dropout!r}")
    _check(o.n_tokens_vocab is None or (_is_int(o.n_tokens_vocab) and o.n_tokens_vocab > 3),
           "n_tokens_vocab", f"must be an integer > 3, got {o.n_tokens_vocab!r}")
    for name in ("n_negative_samples_batch", "batch_size", "unroll_steps", "n_epochs"):
        v = getattr(o, name)
        _check(_is_int(v) and v > 0, name, f"must be a positive integer, got {v!r}")
    _check(o.n_train_tokens is None or (_is_int(o.n_train_tokens) and o.n_train_tokens > 0),
           "n_train_tokens", f"must be a positive integer, got {o.n_train_tokens!r}")
    _check(_is_num(o.all_clip_norm_val) and o.all_clip_norm_val > 0, "all_clip_norm_val",
           f"must be a positive number, got {o.all_clip_norm_val!r}")
    _check(o.learning_rate is None or (_is_num(o.learning_rate) and o.learning_rate > 0),
           "learning_rate", f"must be a positive number, got {o.learning_rate!r}")
    _check(o.sample_softmax is None or isinstance(o.sample_softmax, bool), "sample_softmax",
           f"must be true or false, got {o.sample_softmax!r}")
