"""Hostile chat templates render under a deadline and size limits, and end in a SpecpackError, not a hang."""

from __future__ import annotations

import time

import pytest

from specpack.errors import SpecpackError
from specpack.runtime.chat_template import RenderLimits, render_chat

MESSAGES = [{"role": "user", "content": "call 5551234567 at 100% (width {:>9})"}]
FAST = RenderLimits(seconds=0.5, chars=1 << 16)


def _render(template: str, limits: RenderLimits = FAST) -> str:
    return render_chat(template, MESSAGES, add_generation_prompt=True, variables={"eos_token": "</s>"}, limits=limits)


@pytest.mark.parametrize(("template", "says"), [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "too long"),
    ("{% for m in messages recursive %}{{ loop(messages * 2) }}{% endfor %}", "within bounds"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "within bounds"),
    ("{% for i in range(100000) %}{{ 'abcdefghij' * 100 }}{% endfor %}", "the rendered text"),
    ("{{ 'x' * 1000000000 }}", "repeated"),
    ("{{ ['x'] * 1000000000 }}", "repeated"),
    ("{{ 10 ** 100000000 }}", "a power"),
    ("{{ 'x'|center(1000000000) }}", "center"),
    ("{{ 'x'.ljust(1000000000) }}", "str.ljust"),
    ("{{ '%1000000000s' % 'x' }}", "format width"),
    ("{{ '%*s' % (1000000000, 'x') }}", "argument"),
    ("{{ '{:>1000000000}'.format('x') }}", "format width"),
    ("{{ '{x:>1000000000}'.format_map({'x': 1}) }}", "format width"),
    ("{{ '%1000000000s'|format('x') }}", "format width"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~'"),
])
def test_hostile_templates_end_with_a_clear_error(template: str, says: str) -> None:
    start = time.perf_counter()
    with pytest.raises(SpecpackError) as err:
        _render(template)
    assert says in str(err.value) and "hint" in str(err.value)
    assert time.perf_counter() - start < 5 * FAST.seconds + 2


def test_the_guard_cannot_be_rebound_by_the_template() -> None:
    template = ("{% set items = none %}{% set specpack_loop = none %}"
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    with pytest.raises(SpecpackError, match="too long"):
        _render(template)


def test_real_templates_are_untouched() -> None:
    """Loops, filters, formats and digits in messages render as before; the default limits are generous."""
    template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim }}"
                "{{ '%s|%5d'|format('x', 42) }}{{ '{:>4}'.format('y') }}{{ m['content'].center(60) }}"
                "{% endfor %}{% set ns = namespace(n=0) %}{% for i in range(1000) %}{% set ns.n = ns.n + i %}"
                "{% endfor %}{{ ns.n }}{{ messages | tojson }}")
    out = render_chat(template, MESSAGES, add_generation_prompt=True, variables={})
    assert "5551234567" in out and "x|   42" in out and "   y" in out and "499500" in out


def test_generate_chat_with_a_hanging_template_exits_cleanly(tiny_pack, tmp_path) -> None:
    """The issue's finding: nested range(100000) loops hung `generate --chat`."""
    import hashlib
    import json
    import shutil

    from click.testing import CliRunner

    from specpack.cli.main import cli

    pack = tmp_path / "pack"
    shutil.copytree(tiny_pack("qwen2", "noisy")[0], pack)
    config_path = pack / "tokenizer" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    config_path.write_text(json.dumps(config))
    manifest = json.loads((pack / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["path"] == "tokenizer/tokenizer_config.json")
    entry.update(sha256=hashlib.sha256(config_path.read_bytes()).hexdigest(), size=config_path.stat().st_size)
    (pack / "manifest.json").write_text(json.dumps(manifest))
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["generate", str(pack), "--prompt", "hi", "--chat"])
    assert result.exit_code == 2 and "takes too long to render" in result.output, result.output
    assert time.perf_counter() - start < 30


MEMORY = RenderLimits(seconds=2.0, chars=1 << 20, built=1 << 23)
BIG = "{% set s = 'x' * 1000000 %}"


@pytest.mark.parametrize("template", [
    "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ f('x', 40) }}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% else %}" + "x" * 4096 + "{% endif %}{% endmacro %}"
    "{{ f(40)|length }}",
    BIG + "{% macro g() %}{% for i in range(1000) %}{{ s ~ i }}{% endfor %}{% endmacro %}{{ g()|length }}",
    BIG + "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + [s ~ i] %}{% endfor %}",
    BIG + "{{ ([s] * 1000)|join|length }}",
    BIG + "{{ range(1000)|map('string')|map('center', 1000000)|join|length }}",
    BIG + "{{ s|replace('x', 'xxxxxxxxxx')|length }}",
    "{{ ('x\n' * 500000)|indent(1000)|length }}",
    BIG + "{{ [s] * 1000 }}",
    BIG + "{{ ([s] * 1000)|tojson|length }}",
    BIG + "{{ ([s] * 1000)|string|length }}",
    BIG + "{{ ('%s' * 1000) % ((s,) * 1000) }}",
    BIG + "{{ ('{0}' * 1000).format(s)|length }}",
    "{{ ('{:>999999}' * 1000).format('x')|length }}",
    BIG + "{{ ''.join([s] * 1000)|length }}",
])
def test_memory_stays_bounded_before_the_limits_fire(template: str) -> None:
    """The issue's finding: concatenation inside macros and filters checked after they built their result took a
    render from 96 MB to 3.9 GB. Traced peak memory stays within a small multiple of the limits."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(SpecpackError, match="builds too much"):
            _render(template, MEMORY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MEMORY.built, f"{peak / 1e6:.0f} MB"


RSS_SCRIPT = """
import json, resource, sys
from specpack.errors import SpecpackError
from specpack.runtime.chat_template import render_chat
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for template in json.loads(sys.stdin.read()):
    try:
        render_chat(template, [{"role": "user", "content": "hi"}], add_generation_prompt=True, variables={})
    except SpecpackError:
        pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_peak_rss_of_hostile_templates_at_the_default_limits() -> None:
    """The same templates at the default limits, in a process of their own: its peak RSS grows by well under the
    render budget's worth of memory (the server went from 96 MB to 3.9 GB on one request)."""
    import json
    import subprocess
    import sys

    params = next(m for m in test_memory_stays_bounded_before_the_limits_fire.pytestmark  # type: ignore[attr-defined]
                  if m.name == "parametrize").args[1]
    run = subprocess.run([sys.executable, "-c", RSS_SCRIPT], input=json.dumps(params), capture_output=True, text=True,
                         timeout=60, check=True)
    grew_mb = int(run.stdout.strip())
    assert grew_mb < 256, f"peak RSS grew by {grew_mb} MB"
