import pytest

from edgespec.errors import EdgespecError
from edgespec.runtime.text import TextStream, render_chat


def test_multibyte_character_split_across_tokens_waits_for_its_last_byte():
    stream = TextStream()
    e_acute = "é".encode()  # two bytes
    assert stream.feed(b"caf" + e_acute[:1]) == "caf"
    assert stream.feed(e_acute[1:]) == "é"
    assert stream.flush() == ""


def test_emoji_split_in_four_tokens():
    stream = TextStream()
    parts = [stream.feed(bytes([b])) for b in "🙂".encode()]
    assert parts == ["", "", "", "🙂"]


def test_dangling_partial_character_flushes_as_replacement():
    stream = TextStream()
    assert stream.feed("é".encode()[:1]) == ""
    assert stream.flush() == "\ufffd"


def test_text_that_may_start_a_stop_string_is_held_until_decided():
    stream = TextStream(stop=["<END>"])
    assert stream.feed(b"hello <E") == "hello "
    assert stream.feed(b"NOT") == "<ENOT"
    assert stream.feed(b" bye <EN") == " bye "
    assert stream.feed(b"D> more") == ""
    assert stream.stopped and stream.flush() == ""


def test_stop_string_split_across_pieces_and_earliest_wins():
    stream = TextStream(stop=["xyz", "b"])
    assert stream.feed(b"aaxy") == "aa"
    assert stream.feed(b"b") == "xy"
    assert stream.stopped


TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_render_chat_adds_generation_prompt():
    text = render_chat(TEMPLATE, [{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_render_chat_errors_are_user_errors():
    with pytest.raises(EdgespecError, match="no chat template"):
        render_chat(None, [{"role": "user", "content": "Hi"}])
    with pytest.raises(EdgespecError, match="role"):
        render_chat(TEMPLATE, [{"content": "Hi"}])
    with pytest.raises(EdgespecError, match="refused"):
        render_chat("{{ raise_exception('only user turns') }}", [{"role": "user", "content": "Hi"}])
