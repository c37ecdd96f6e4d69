"""The `edgespec` command, its commands grouped by what they do (run, measure, train, export, models), all on
the Python API (edgespec.api)."""

from __future__ import annotations

import click

from edgespec import __version__
from edgespec.cli import export, measure, models, run, train
from edgespec.errors import EdgespecError


class _Group(click.Group):
    """Errors a user can cause print without a traceback and exit 1, whoever finds them: edgespec (an
    EdgespecError, one line) or click (a usage error: a bad or missing option or value, after the usage line),
    which would exit 2 by itself. One status for every mistake a user can make, as the README promises."""

    def make_context(self, *args, **kwargs):  # the group's own options: edgespec --bad
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            e.exit_code = 1
            raise

    def invoke(self, ctx):  # a command's name, options and run
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            e.exit_code = 1
            raise
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgespec")
def main():
    """Exact speculative decoding for on-device LLMs (GGUF through llama.cpp)."""


for command in (run.generate, run.chat, run.serve, measure.bench, measure.plan, measure.profiles, measure.doctor,
                measure.advise, train.distill, train.draft_vocab_cmd, train.train_heads_cmd, export.export_cmd,
                export.export_pair_cmd, export.default_checkpoint, models.pull, models.models_cmd):
    main.add_command(command)
