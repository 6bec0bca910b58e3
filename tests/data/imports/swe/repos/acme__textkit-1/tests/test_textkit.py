import pytest
from textkit import slugify, truncate, wrap


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_accents_and_separator():
    assert slugify("Cr\u00e8me Br\u00fbl\u00e9e", sep="_") == "creme_brulee"


def test_truncate_short_text_unchanged():
    assert truncate("hi", 10) == "hi"


def test_truncate_long_text():
    assert truncate("abcdefghij", 6) == "abc..."


def test_truncate_width_below_placeholder():
    with pytest.raises(ValueError):
        truncate("abcdef", 2)


def test_wrap_breaks_between_words():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_wrap_long_word_on_its_own_line():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]
