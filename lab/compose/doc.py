"""docs/deploy-compose.md's command blocks, run as the doc writes them (the compose smoke run).

Owns: turning each command of a marked block (lab.compose.plan.doc_commands) into what this
engine runs: `docker compose ARGS` is podman-compose with the same ARGS (the project name and
compose files come from the environment, lab.compose.engine), `docker pause|unpause|kill X` is
podman's, `make ...` and `. FILE` are what they say, and `NAME=value` on a line of its own sets a
value later lines expand as `$NAME`. Two commands are carried out by the runner itself, because
this engine cannot do what they ask as asked: `docker compose ... build` (the build must trust
this machine's CA bundle, lab.compose.images) and `docker compose ... up -d [SERVICE...]`
(podman 4.3 ignores `service_healthy`, lab.compose.up). Each is said in the progress lines.
Must never: run a command it does not recognise (that is an error naming the line), or change the
doc's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab.compose.engine import Engine
from lab.compose.plan import DocCommand, doc_block, doc_commands, expand

__all__ = ["DocRunner", "DocStepFailed", "read_env_file", "split_subcommand"]


class DocStepFailed(Exception):
    """A doc command failed: the message quotes the line and the tail of its output."""


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines (deploy/compose.env), comments and blank lines skipped."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def split_subcommand(args: list[str]) -> tuple[list[str], str, list[str]]:
    """Split `[global options] SUBCOMMAND [rest]` of a compose command line."""
    with_value = {"--env-file", "-f", "--file", "-p", "--project-name", "--profile"}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in with_value else 1
    if i >= len(args):
        raise ValueError(f"no compose subcommand in {args}")
    return args[:i], args[i], args[i + 1 :]


@dataclass
class DocRunner:
    engine: Engine
    doc: str  # the text of docs/deploy-compose.md
    progress: Callable[[str], None]
    build: Callable[[], None]  # the runner's image build
    #: the runner's ordered up: compose global options, services (none: all), environment
    up: Callable[[list[str], list[str], dict[str, str]], None]
    log: Path  # every command's output is appended here
    values: dict[str, str] = field(default_factory=dict)  # what `$NAME` expands to

    def block(self, name: str) -> list[DocCommand]:
        try:
            return doc_commands(doc_block(self.doc, name))
        except ValueError as exc:  # the doc lost or broke a block the run follows
            raise DocStepFailed(str(exc)) from exc

    def run_block(
        self, name: str, *, skip: Callable[[DocCommand], bool] | None = None
    ) -> list[str]:
        """Run every command of the block; returns each command's stdout."""
        outputs = []
        for cmd in self.block(name):
            if skip is not None and skip(cmd):
                self.progress(f"doc [{name}] not run here: {cmd.text}")
                continue
            outputs.append(self.run(name, cmd))
        return outputs

    def run(self, name: str, cmd: DocCommand) -> str:
        try:
            return self._run(name, cmd)
        except KeyError as exc:  # the doc uses a variable the run does not have
            raise DocStepFailed(f"{cmd.text}: {exc.args[0]}") from exc

    def _run(self, name: str, cmd: DocCommand) -> str:  # noqa: PLR0911 - one return per kind of line
        if not cmd.argv:  # NAME=value alone: a value for the lines after it
            self.values.update({k: expand(v, self._env()) for k, v in cmd.env.items()})
            return ""
        argv = [expand(word, self._env()) for word in cmd.argv]
        env = {k: expand(v, self._env()) for k, v in cmd.env.items()}
        self.progress(f"doc [{name}] {cmd.text}")
        if argv[0] == "." and len(argv) == 2:
            self.values.update(read_env_file(self.engine.root / argv[1]))
            return ""
        if argv[:2] == ["docker", "compose"]:
            options, sub, rest = split_subcommand(argv[2:])
            if sub == "build" and not rest:
                self.progress("  (built by the runner: the build trusts this machine's CA)")
                self.build()
                return ""
            if sub == "up" and rest[:1] == ["-d"] and not any(r.startswith("-") for r in rest[1:]):
                self.progress("  (started by the runner in depends_on order, see lab.compose.up)")
                self.up(options, rest[1:], env)
                return ""
            return self._checked(cmd, [self.engine.podman_compose, *argv[2:]], env)
        if argv[0] == "docker" and len(argv) > 1 and argv[1] in ("pause", "unpause", "kill"):
            return self._checked(cmd, ["podman", *argv[1:]], env)
        if argv[0] == "make":
            return self._checked(cmd, argv, env)
        raise DocStepFailed(f"compose-smoke cannot run this doc line: {cmd.text}")

    def _env(self) -> dict[str, str]:
        return {**self.engine.env, **self.values}

    def _checked(self, cmd: DocCommand, argv: list[str], env: dict[str, str]) -> str:
        try:
            proc = self.engine.run(argv, env=env, timeout_s=1800, check=False)
        except Exception as exc:  # a timeout is the doc step's failure, named by its line
            raise DocStepFailed(f"{cmd.text}: {exc}") from exc
        with self.log.open("a", encoding="utf-8") as f:
            f.write(f"$ {cmd.text}\n{proc.stdout}{proc.stderr}\n[exit {proc.returncode}]\n")
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
            raise DocStepFailed(f"`{cmd.text}` exited {proc.returncode}:\n{tail}")
        return proc.stdout
