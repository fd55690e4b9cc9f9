"""Word segmentation: `elmo_jax.tokenize(line, lang)` (jieba for Chinese)."""
import pytest

import elmo_jax
from elmo_jax.data.segmentation import SegmentationError

SUBWAY = "12号地铁线马上就要开通了，以后我们出行就更加方便了。"
DINNER = "你什么时候方便，我们一起吃个饭。"


def test_the_two_senses_of_fangbian_are_tokens():
    for line in (SUBWAY, DINNER):
        tokens = elmo_jax.tokenize(line, lang="zh")
        assert "方便" in tokens and "".join(tokens) == line
    assert elmo_jax.tokenize(DINNER, lang="zh")[:4] == ["你", "什么", "时候", "方便"]


def test_mixed_latin_text_and_full_width_punctuation():
    tokens = elmo_jax.tokenize("我用 ELMo模型和JAX 0.10训练了3天！好吗？", lang="zh")
    assert "ELMo" in tokens and "JAX" in tokens and "0.10" in tokens
    assert tokens[-1] == "？" and "！" in tokens and " " not in "".join(tokens)
    assert elmo_jax.tokenize("   ", lang="zh") == []
    assert elmo_jax.tokenize("Hello, world.", lang="en") == ["Hello", ",", "world", "."]
    with pytest.raises(ValueError, match="lang"):
        elmo_jax.tokenize(DINNER, lang="cn")


def test_a_missing_jieba_is_one_line_naming_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "jieba", None)  # import jieba -> ImportError
    with pytest.raises(SegmentationError) as e:
        elmo_jax.tokenize(DINNER, lang="zh")
    assert "\n" not in str(e.value) and "elmo-jax[zh]" in str(e.value)
