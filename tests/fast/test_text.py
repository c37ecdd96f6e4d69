import pytest

from edgespec.decode.text import TextStream, render_chat
from edgespec.errors import EdgespecError


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


def test_render_chat_offers_what_transformers_templates_use():
    # {% break %}, {% generation %} blocks, strftime_now, and a tojson that keeps key order and leaves <, & as is
    template = ("{% for m in messages %}{% if m['role'] == 'stop' %}{% break %}{% endif %}"
                "{% generation %}{{ m['content'] }};{% endgeneration %}{% endfor %}"
                "{{ tools | tojson }}|{{ {'b': 'é'} | tojson(indent=1) }}|{{ strftime_now('%Y') | length }}")
    messages = [{"role": "user", "content": "a"}, {"role": "stop", "content": "b"}, {"role": "user", "content": "c"}]
    text = render_chat(template, messages, tools=[{"z": "<x> & y", "a": 1}])
    assert text == 'a;[{"z": "<x> & y", "a": 1}]|{\n "b": "é"\n}|4'


def test_render_chat_passes_generation_prompt_tools_and_template_variables():
    template = ("{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ enable_thinking }}"
                "{% if add_generation_prompt %} open{% endif %}")
    messages = [{"role": "user", "content": "Hi"}]
    assert render_chat(template, messages, enable_thinking=False) == "True True True False open"
    assert render_chat(template, messages, add_generation_prompt=False, enable_thinking=1) == "True True True 1"


def test_a_set_inside_a_generation_block_stays_inside():
    template = "{% generation %}{% set x = 1 %}{{ x }}{% endgeneration %}[{{ x }}]"
    assert render_chat(template, [{"role": "user", "content": "Hi"}]) == "1[]"


@pytest.mark.parametrize("template, content", [
    ("{% for m in messages %}{{ m['content'] + '!' }}{% endfor %}", None),  # None + str: a TypeError
    ("{% for m in messages %}{{ m['content'] }}", "Hi"),  # no endfor: a syntax error
    ("{{ messages[0]['content'].upper() + messages[5]['content'].upper() }}", "Hi"),  # undefined
])
def test_a_template_that_breaks_on_the_messages_is_a_user_error(template, content):
    with pytest.raises(EdgespecError, match="chat template failed"):
        render_chat(template, [{"role": "user", "content": content}])
