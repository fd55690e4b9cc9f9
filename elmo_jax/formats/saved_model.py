"""The TensorFlow SavedModel: any elmo-jax model with TF-Hub ELMo's interface
(`google/elmo/3`), reusable and trainable in TF2 (docs/formats/serving.md).

Signatures (what TF Serving, `saved_model_cli` and `hub.KerasLayer(...,
signature=...)` call):

    default          text [B] string: sentences, split on spaces (no empty tokens)
    tokens           tokens [B, T] string padded with "", sequence_len [B] int32
    serving_default  the `default` signature

Each returns word_emb [B, T, P] (the token layer), lstm_outputs1..L [B, T, 2P],
elmo [B, T, 2P] (gamma * softmax(w) . the layers, the token layer doubled as
elmo-jax's layer 0 is), default [B, 2P] (elmo's mean over real tokens; zeros
for an empty sentence) and sequence_len [B]; padded positions are zeros.

The object itself is a reusable SavedModel (TF-Hub's TF2 API):
`__call__(inputs, training=False)` takes the sentences or a {"tokens",
"sequence_len"} dict and returns the same dict; `variables`,
`trainable_variables` (the mix's layer weights and gamma; the biLM's weights
too when exported with `trainable_bilm`) and `regularization_losses` (none).
The spelling runs in TF string ops (bilm-tf's UTF-8 bytes and marks, or an
ELMoForManyLangs model's dictionaries as lookup tables), the biLM as one
XlaCallModule (jax2tf, lowered for cpu, cuda and tpu, batch and length
symbolic) whose weights are variables. TensorFlow is imported only here.
"""
from __future__ import annotations

import numpy as np

from elmo_jax.core import chars as chars_lib
from elmo_jax.core import lexicon as lexicon_lib
from elmo_jax.core.embedding import init_mix
from elmo_jax.core.options import ElmoOptions
from elmo_jax.formats.jax_export import PLATFORMS, flat_weights, layers_function

SAVED_MODEL_FILE = "saved_model.pb"  # what a loader opens first: uploaded last


def write_saved_model(folder: str, params: dict, options: ElmoOptions,
                      lexicon: lexicon_lib.Lexicon | None = None, mix: dict | None = None,
                      trainable_bilm: bool = False) -> None:
    """Write the SavedModel into the local `folder`.

    Args:
        folder: an empty local folder.
        params: the biLM's parameters.
        options: the model's `ElmoOptions`.
        lexicon: the dictionaries of a model that spells with them.
        mix: {"weights": [1, L+1] or [L+1], "gamma": [1] or []} starting
            values of the mix (default: equal weights, gamma 1).
        trainable_bilm: the biLM's weights are trainable variables too
            (gradients through elmo-jax's backward passes); else its output
            is a constant to TF (`tf.stop_gradient`).
    """
    import tensorflow as tf

    mix = mix if mix is not None else init_mix(options)
    module = _elmo_module(tf, params, options, lexicon, mix, trainable_bilm)
    signatures = {"default": module.default_signature, "tokens": module.tokens_signature,
                  "serving_default": module.default_signature}
    tf.saved_model.save(module, folder, signatures=signatures)


def _elmo_module(tf, params, options, lexicon, mix, trainable_bilm: bool):
    """The tf.train.Checkpoint (a trackable object) that is saved."""
    from jax.experimental import jax2tf

    layers_and_mask = layers_function(options)
    # layers only: TF's zero cotangent of an unused output (the mask) comes
    # with the wrong shape into the converted backward pass
    bilm = jax2tf.convert(lambda w, ids: layers_and_mask(w, ids)[0],
                          polymorphic_shapes=[None, "(b, t, _)"],
                          native_serialization_platforms=PLATFORMS, with_gradient=trainable_bilm)
    spell, tables = tf_spelling(tf, options, lexicon)
    obj = tf.train.Checkpoint()
    obj.lookup_tables = tables  # saved with the object, as its assets
    obj.bilm_weights = {k: tf.Variable(v, trainable=trainable_bilm, name=k.replace("/", "."))
                        for k, v in flat_weights(params).items()}
    obj.mix_weights = tf.Variable(np.reshape(np.asarray(mix["weights"], np.float32), [-1]),
                                  name="mix_weights")
    obj.gamma = tf.Variable(np.reshape(np.asarray(mix["gamma"], np.float32), []), name="gamma")
    P, n_lstm = options.lstm.projection_dim, options.lstm.n_layers

    text_spec = tf.TensorSpec([None], tf.string, name="text")
    token_specs = (tf.TensorSpec([None, None], tf.string, name="tokens"),
                   tf.TensorSpec([None], tf.int32, name="sequence_len"))

    # one trace of the biLM (a lowering for three platforms) that every
    # signature and trace of __call__ calls
    @tf.function(input_signature=token_specs, autograph=False)
    def outputs(tokens, sequence_len):
        B, T = tf.shape(tokens)[0], tf.shape(tokens)[1]
        checks = [
            tf.debugging.assert_positive(B, message="an empty batch: pass at least one sentence"),
            tf.debugging.assert_less_equal(
                sequence_len, T, message="sequence_len is longer than the tokens' max_length"),
            tf.debugging.assert_non_negative(sequence_len, message="a negative sequence_len")]
        with tf.control_dependencies(checks):
            T1 = tf.maximum(T, 1)  # the program takes at least one position
            real = tf.sequence_mask(sequence_len, T1)
            padded = tf.pad(tokens, [[0, 0], [0, T1 - T]], constant_values="")
            layers = bilm(obj.bilm_weights, spell(padded, real))
        if not trainable_bilm:  # no gradient asked of the converted program
            layers = tf.stop_gradient(layers)
        layers = layers[:, :, :T]
        mask = tf.cast(tf.sequence_mask(sequence_len, T), tf.float32)[..., None]
        elmo = obj.gamma * tf.einsum("k,kbtd->btd", tf.nn.softmax(obj.mix_weights), layers) * mask
        count = tf.maximum(tf.cast(sequence_len, tf.float32), 1.0)[:, None]
        out = {"word_emb": layers[0, :, :, :P], "elmo": elmo,
               "default": tf.reduce_sum(elmo, axis=1) / count, "sequence_len": sequence_len}
        out.update({f"lstm_outputs{i}": layers[i] for i in range(1, n_lstm + 1)})
        return out

    def split(text):
        words = tf.strings.split(text, sep=" ")
        words = tf.ragged.boolean_mask(words, tf.strings.length(words) > 0)
        return words.to_tensor(default_value=""), tf.cast(words.row_lengths(), tf.int32)

    obj.default_signature = tf.function(lambda text: outputs(*split(text)),
                                        input_signature=[text_spec], autograph=False)
    obj.tokens_signature = outputs  # its input signature is the `tokens` signature's

    @tf.function(autograph=False)
    def call(inputs, training=False):
        del training  # no dropout: the same vectors in training and inference
        if isinstance(inputs, dict):
            return outputs(inputs["tokens"], inputs["sequence_len"])
        return outputs(*split(inputs))

    for training in (False, True):  # the traces a reloaded object can run
        call.get_concrete_function(text_spec, training)
        call.get_concrete_function({"tokens": token_specs[0], "sequence_len": token_specs[1]},
                                   training)
    obj.__call__ = call
    obj.trainable_variables = [obj.mix_weights, obj.gamma] + (
        list(obj.bilm_weights.values()) if trainable_bilm else [])
    obj.variables = [obj.mix_weights, obj.gamma] + list(obj.bilm_weights.values())
    obj.regularization_losses = []
    return obj


def tf_spelling(tf, options: ElmoOptions, lexicon):
    """(spell, its lookup tables): spell(tokens [B, T] string, real [B, T]
    bool) -> char_ids [B, T, C] int32 is `batch_to_char_ids` (or the
    lexicon's `batch_ids`) in TF ops, all zeros where not real."""
    cnn, C = options.char_cnn, options.char_cnn.max_characters_per_token
    if cnn.spelling == "lexicon":
        return _lexicon_spelling(tf, cnn.max_characters_per_token, lexicon)
    bounds = tf.constant(chars_lib.boundary_ids(cnn))
    bow, eow, pad = (chars_lib.BOW_CHAR + 1, chars_lib.EOW_CHAR + 1, chars_lib.PAD_CHAR + 1)

    def spell(tokens, real):
        cut = tf.strings.substr(tokens, 0, C - 2, unit="BYTE")  # bilm-tf cuts bytes
        n = tf.strings.length(cut)[..., None]
        raw = tf.cast(tf.io.decode_raw(cut, tf.uint8, fixed_length=C - 2), tf.int32)
        byte = tf.pad(raw, [[0, 0], [0, 0], [1, 1]])  # position j holds byte j - 1
        j = tf.range(C)
        ids = tf.where(j == 0, bow, tf.where(j <= n, byte + 1, tf.where(j == n + 1, eow, pad)))
        return _finish(tf, ids, tokens, real, ("<S>", "</S>"), bounds)

    return spell, []


def _lexicon_spelling(tf, max_chars: int, lexicon):
    """An ELMoForManyLangs model's spelling: characters (code points, cut to
    max_chars - 2) and the cut word, looked up in tables."""
    def table(rows: dict, default: int):
        keys = tf.constant(list(rows), tf.string)
        values = tf.constant(list(rows.values()), tf.int64)
        return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values),
                                         default_value=default)

    char_table = table(lexicon.char_rows, lexicon_lib.OOV)
    words = lexicon.word_rows
    word_table = None if words is None else table(words, lexicon_lib.WORD_OOV)
    bounds = tf.constant(lexicon_lib.boundary_ids(max_chars, words is not None))
    W = max_chars - 2

    def spell(tokens, real):
        shape = tf.shape(tokens)
        letters = tf.strings.unicode_split(tf.reshape(tokens, [-1]), "UTF-8")[:, :W]
        rows = tf.ragged.map_flat_values(char_table.lookup, letters)
        n = tf.reshape(tf.cast(letters.row_lengths(), tf.int32), tf.concat([shape, [1]], 0))
        body = tf.reshape(tf.cast(rows.to_tensor(default_value=lexicon_lib.PAD, shape=[None, W]),
                                  tf.int32), tf.concat([shape, [W]], 0))
        body = tf.pad(body, [[0, 0], [0, 0], [1, 1]])
        j = tf.range(max_chars)
        ids = tf.where(j == 0, lexicon_lib.BOW,
                       tf.where(j <= n, body, tf.where(j == n + 1, lexicon_lib.EOW,
                                                        lexicon_lib.PAD)))
        if word_table is not None:
            word = word_table.lookup(tf.strings.reduce_join(letters, axis=-1))
            ids = tf.concat([ids, tf.reshape(tf.cast(word, tf.int32), tf.concat([shape, [1]], 0))],
                            axis=-1)
        return _finish(tf, ids, tokens, real, ("<bos>", "<eos>"), bounds)

    return spell, [t for t in (char_table, word_table) if t is not None]


def _finish(tf, ids, tokens, real, boundary_tokens, bounds):
    """The boundary tokens' own spellings; zeros where not real."""
    for i, name in enumerate(boundary_tokens):
        ids = tf.where((tokens == name)[..., None], bounds[i], ids)
    return tf.where(real[..., None], ids, 0)
