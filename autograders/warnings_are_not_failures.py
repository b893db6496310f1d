"""Keep correct code that prints warnings from losing points.

nbgrader 0.9 scores a test cell 0 when it has *any* stderr output, and its Validate button
reports such a cell as failed. torch, Lightning and gloo write warnings to stderr from perfectly
correct code. This ``Execute`` relabels a cell's stderr streams as stdout once the cell has run:
failures are exceptions ("error" outputs) and stay untouched, and every warning's text stays
visible in the feedback. ``nbgrader_config.py`` puts it in place of nbgrader's own ``Execute``.
"""

from nbgrader.preprocessors import Execute


def relabel_stderr(cell) -> None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            output["name"] = "stdout"


class ExecuteStderrIsNotFailure(Execute):
    def on_cell_executed(self, **kwargs):
        super().on_cell_executed(**kwargs)  # nbgrader records errors the kernel replied with
        relabel_stderr(kwargs["cell"])
