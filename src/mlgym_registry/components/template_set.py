"""``TemplateSet``: the prompt templates an agent config carries, with MLGym's field names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateSet:
    """Prompt templates in MLGym's shape, formatted with ``str.format`` placeholders.

    ``system_template`` takes ``{command_docs}``, the tool env variables (``{WINDOW}``), every task field
    (``{training_timeout}``) and ``{format_instructions}`` (how the task's parser wants replies written); the others
    take the task fields, the ``state`` JSON fields (``{open_file}``, ``{working_dir}``), ``{current_step}``,
    ``{remaining_steps}`` and ``{observation}``. ``format_error_template`` is the retry message after a reply without
    a command; when it is None the parser's ``format_error_message`` is used. docs/plugins.md has the full table.
    """

    name: str
    system_template: str
    task_template: str
    next_step_template: str | None = None
    next_step_no_output_template: str | None = None
    strategy_template: str | None = None
    demonstration_template: str | None = None
    format_error_template: str | None = None

    @property
    def next_step(self) -> str:
        """The template after a step with output (MLGym falls back to the task template)."""
        return self.next_step_template or self.task_template

    @property
    def next_step_no_output(self) -> str:
        """The template after a step without output (MLGym falls back to ``next_step``)."""
        return self.next_step_no_output_template or self.next_step
