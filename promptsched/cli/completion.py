"""``promptsched completion bash|zsh``: a shell completion script for every subcommand and
flag, generated from the parser itself so it cannot drift from the commands."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from typing import Any

ROOT = "promptsched"

_BASH = """\
# promptsched completion for bash: eval "$(promptsched completion bash)" in ~/.bashrc
declare -gA _promptsched_sub=(
{children}
)
declare -gA _promptsched_opt=(
{flags}
)
_promptsched() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmdpath="promptsched" word candidate i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        [[ "$word" == -* ]] && continue
        candidate="$cmdpath $word"
        if [[ -n "${{_promptsched_sub[$candidate]+x}}${{_promptsched_opt[$candidate]+x}}" ]]; then
            cmdpath="$candidate"
        fi
    done
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "${{_promptsched_opt[$cmdpath]}}" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "${{_promptsched_sub[$cmdpath]}}" -- "$cur"))
    fi
}}
complete -F _promptsched promptsched
"""

_ZSH = """\
#compdef promptsched
# promptsched completion for zsh: eval "$(promptsched completion zsh)" in ~/.zshrc (after
# compinit), or save it as _promptsched in a directory of your $fpath.
typeset -gA _promptsched_sub _promptsched_opt
_promptsched_sub=(
{children}
)
_promptsched_opt=(
{flags}
)
_promptsched() {{
    local cmdpath="promptsched" word candidate
    local -i i
    for (( i = 2; i < CURRENT; i++ )); do
        word="${{words[i]}}"
        [[ "$word" == -* ]] && continue
        candidate="$cmdpath $word"
        if (( ${{+_promptsched_sub[$candidate]}} || ${{+_promptsched_opt[$candidate]}} )); then
            cmdpath="$candidate"
        fi
    done
    if [[ "${{words[CURRENT]}}" == -* ]]; then
        compadd -- ${{=_promptsched_opt[$cmdpath]}}
    else
        compadd -- ${{=_promptsched_sub[$cmdpath]}}
    fi
}}
if [[ "${{zsh_eval_context[-1]}}" == loadautofunc ]]; then
    _promptsched "$@"  # autoloaded from $fpath: this is the first completion
else
    compdef _promptsched promptsched
fi
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            choices: dict[str, argparse.ArgumentParser] = dict(action.choices)
            return choices
    return {}


def walk(
    parser: argparse.ArgumentParser, path: str = ROOT
) -> Iterator[tuple[str, list[str], list[str]]]:
    """(command path, its subcommands, its flags) for the parser and every subparser."""
    children = subcommands(parser)
    flags = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})
    yield path, list(children), flags
    for name, child in children.items():
        yield from walk(child, f"{path} {name}")


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    entries = list(walk(parser))

    def table(index: int) -> str:
        """bash's ``[key]=value`` entries; zsh's ``key value`` pairs (any zsh version)."""
        rows = [(shlex.quote(path), shlex.quote(" ".join(items[index - 1])))
                for path, *items in entries]  # fmt: skip
        shape = "    [{}]={}" if shell == "bash" else "    {} {}"
        return "\n".join(shape.format(path, words) for path, words in rows)

    template = _BASH if shell == "bash" else _ZSH
    return template.format(children=table(1), flags=table(2))


def cmd_completion(args: argparse.Namespace, config: Any) -> int:
    print(script(args.root_parser, args.shell), end="")
    return 0


def register(sub: Any, root: argparse.ArgumentParser) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='Enable with: eval "$(promptsched completion bash)" (or zsh) in your '
        "shell's startup file.",
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(func=cmd_completion, root_parser=root, needs_config=False)
