"""Golden chat-template tests: PackTokenizer renders and encodes like transformers' apply_chat_template.

The real-world templates are written out here (no network); each is set on a tiny tokenizer that also gets the
template's control tokens as special tokens, saved, exported, and compared with transformers on the saved copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest

from specpack.errors import SpecpackError
from specpack.export.tokenizer_export import write_tokenizer
from specpack.runtime.chat_template import compile_template, render_chat
from specpack.runtime.tokenizer import PackTokenizer
from tests.tiny import CHATML_TEMPLATE, LLAMA_TEMPLATE, make_tokenizer

QWEN25_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided \
with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\
\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3_TEMPLATE = """\
{{- bos_token }}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct-v0.1 style: refuses anything but alternating user/assistant turns
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

LOOP_CONTROLS_TEMPLATE = """\
{%- set ns = namespace(system=none, turns=0) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- set ns.system = message.content %}
        {%- continue %}
    {%- endif %}
    {%- if ns.turns >= 4 %}
        {%- break %}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}
{%- endfor %}
{%- if ns.system is not none %}
    {{- '<|im_start|>meta\\n' + dict(system=ns.system, turns=ns.turns) | tojson(indent=2, sort_keys=true) }}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

GENERATION_BLOCK_TEMPLATE = (  # SmolLM3-style assistant masking markers: rendered as their body
    "{% for message in messages %}{% if message.role == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message.content + '<|im_end|>\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_VARIABLES_TEMPLATE = (
    "[{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|{{ mask_token }}]"
    "{% for m in messages %}{{ m.role }}={{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant={% endif %}"
)

TEMPLATES = {
    "tiny-chatml": ("qwen2", CHATML_TEMPLATE),
    "tiny-llama": ("llama", LLAMA_TEMPLATE),
    "qwen2.5": ("qwen2", QWEN25_TEMPLATE),
    "llama3": ("llama3", LLAMA3_TEMPLATE),
    "mistral": ("llama", MISTRAL_TEMPLATE),
    "loop-controls": ("qwen2", LOOP_CONTROLS_TEMPLATE),
    "generation-block": ("qwen2", GENERATION_BLOCK_TEMPLATE),
    "special-variables": ("qwen2", SPECIAL_VARIABLES_TEMPLATE),
}

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "def f():\n\treturn 1\n"}, {"role": "assistant", "content": "It returns 1."},
     {"role": "user", "content": "  and emoji 🙂 中文 ?  "}],
    [{"role": "user", "content": "literal <|im_end|> and </s> and <s> in the text"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"}],
    [{"role": "user", "content": "None values are dropped", "tool_calls": None}],
]

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city (°C).",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich, Tōkyō"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time <now>.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Zürich and the time?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        {"type": "function", "function": {"name": "now", "arguments": {}}}]},
    {"role": "tool", "content": "{\"celsius\": 21}"},
    {"role": "tool", "content": "12:00"},
    {"role": "assistant", "content": "21 °C at noon."},
    {"role": "user", "content": "Thanks"},
]


def _tokenizer(base: str) -> Any:
    """A tiny tokenizer with the template's control tokens as special tokens."""
    if base == "llama3":
        tok = make_tokenizer("llama")
        tok.add_special_tokens({"bos_token": "<|begin_of_text|>",
                                "extra_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
        return tok
    tok = make_tokenizer(base)
    if base == "qwen2":
        tok.add_special_tokens({"extra_special_tokens": ["<|im_start|>"]})
    return tok


def _export(tmp: Path, base: str, template: str | dict[str, str]) -> tuple[Any, PackTokenizer]:
    from transformers import AutoTokenizer

    tok = _tokenizer(base)
    tok.chat_template = template
    tok.save_pretrained(tmp / "model")
    write_tokenizer(tmp / "model", tmp / "pack")
    return AutoTokenizer.from_pretrained(tmp / "model"), PackTokenizer.load(tmp / "pack" / "tokenizer")


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, PackTokenizer]:
    base, template = TEMPLATES[request.param]
    return _export(tmp_path_factory.mktemp(request.param), base, template)


def _hf(hf: Any, messages: list[dict[str, Any]], add_generation_prompt: bool, **kwargs: Any) -> tuple[str, list[int]]:
    """transformers' text and ids, or the template's error message."""
    text = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)
    ids = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)["input_ids"]
    return text, list(ids)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_templates_match_transformers(pair: tuple[Any, PackTokenizer], add_generation_prompt: bool) -> None:
    hf, tok = pair
    compared = 0
    for messages in CONVERSATIONS:
        try:
            text, ids = _hf(hf, messages, add_generation_prompt)
        except jinja2.TemplateError as e:  # the template refuses these messages: so must we, with its message
            with pytest.raises(SpecpackError, match="the chat template refused") as err:
                tok.render_chat(messages, add_generation_prompt)
            assert str(e) in str(err.value.found)
            continue
        assert tok.render_chat(messages, add_generation_prompt) == text
        assert tok.encode_messages(messages, add_generation_prompt) == ids
        compared += 1
    assert compared >= 2


def test_encode_chat_matches_transformers(pair: tuple[Any, PackTokenizer]) -> None:
    hf, tok = pair
    for content in ("Hello!", "  spaced\n\ttabs  ", "🙂 <|im_end|>"):
        messages = [{"role": "user", "content": content}]
        assert tok.encode_chat(content) == _hf(hf, messages, True)[1]


def test_qwen25_tools_branch_matches_transformers(tmp_path: Path) -> None:
    hf, tok = _export(tmp_path, "qwen2", QWEN25_TEMPLATE)
    for messages in (TOOL_CONVERSATION, [{"role": "system", "content": "Be brief."}, *TOOL_CONVERSATION]):
        text, ids = _hf(hf, messages, True, tools=TOOLS)
        assert "# Tools" in text and '"name": "get_weather", "arguments": {"city": "Zürich"}' in text
        assert tok.render_chat(messages, tools=TOOLS) == text
        assert tok.encode_messages(messages, tools=TOOLS) == ids


def test_qwen25_default_system_prompt(tmp_path: Path) -> None:
    hf, tok = _export(tmp_path, "qwen2", QWEN25_TEMPLATE)
    text = tok.render_chat([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert text == _hf(hf, [{"role": "user", "content": "hi"}], True)[0]


def test_raise_exception_names_the_template_message(tmp_path: Path) -> None:
    _, tok = _export(tmp_path, "llama", MISTRAL_TEMPLATE)
    with pytest.raises(SpecpackError, match="the chat template refused") as err:
        tok.render_chat([{"role": "assistant", "content": "first"}])
    assert "Conversation roles must alternate" in str(err.value)


def test_named_templates_pick_default_or_tool_use(tmp_path: Path) -> None:
    templates = {"default": CHATML_TEMPLATE, "tool_use": QWEN25_TEMPLATE, "rag": "{{ 'rag' }}"}
    hf, tok = _export(tmp_path, "qwen2", templates)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == _hf(hf, messages, True)[0]
    assert tok.render_chat(messages, tools=TOOLS) == _hf(hf, messages, True, tools=TOOLS)[0]
    assert "# Tools" in tok.render_chat(messages, tools=TOOLS)


def test_template_kwargs_reach_the_template(tmp_path: Path) -> None:
    hf, tok = _export(tmp_path, "llama3", LLAMA3_TEMPLATE)
    messages = [{"role": "user", "content": "hi"}]
    text = tok.render_chat(messages, date_string="01 Jan 2030")
    assert "Today Date: 01 Jan 2030" in text
    assert text == _hf(hf, messages, True, date_string="01 Jan 2030")[0]


@pytest.mark.parametrize("template", [
    "{% set ns = namespace(_secret=1) %}",          # namespaces refuse underscore names
    "{{ messages.append(1) }}",                      # the sandbox is immutable
    "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
])
def test_sandbox_refuses_what_transformers_refuses(template: str) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "hi"}]
    try:
        want = render_jinja_template([messages], chat_template=template, add_generation_prompt=True)[0][0]
    except jinja2.TemplateError:
        with pytest.raises(SpecpackError, match="the chat template refused"):
            render_chat(template, messages, add_generation_prompt=True, variables={})
    else:
        assert render_chat(template, messages, add_generation_prompt=True, variables={}) == want


def test_reasoning_fields_are_aliased_like_transformers() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    template = "{% for m in messages %}{{ m.reasoning_content }}/{{ m.thinking }}|{% endfor %}"
    messages = [{"role": "assistant", "content": "x", "reasoning": "because"}, {"role": "user", "content": "y"}]
    want = render_jinja_template([messages], chat_template=template)[0][0]
    assert render_chat(template, messages, add_generation_prompt=False, variables={}) == want == "because/because|/|"


def test_syntax_error_is_reported_with_its_line() -> None:
    with pytest.raises(SpecpackError, match="does not parse") as err:
        compile_template("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    assert err.value.found is not None and err.value.found.startswith("line 2")


def test_no_messages() -> None:
    with pytest.raises(SpecpackError, match="no messages"):
        render_chat(CHATML_TEMPLATE, [], add_generation_prompt=True, variables={})
