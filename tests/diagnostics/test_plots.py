"""The troubleshooting page's figures are readable in its ~700 px content column."""

from __future__ import annotations

import io

import matplotlib
import matplotlib.image
import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from trainopt_site.diagnostics.plots import blow_up_diagnosis, blow_up_figure, runs_figure

COLUMN_PX, DPI, MIN_PX = 700, 110, 9.0  # the site saves figures at 110 dpi, bbox "tight"


def _smallest_text_px(fig) -> float:
    """Height in px of the smallest text of ``fig`` once scaled to fit the content column."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, bbox_inches="tight", format="png")
    plt.close(fig)
    buffer.seek(0)
    width_px = matplotlib.image.imread(buffer).shape[1]
    sizes = [
        t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
    ]
    return min(sizes) * DPI / 72 * min(1.0, COLUMN_PX / width_px)


@pytest.mark.parametrize(
    "make",
    [
        lambda: runs_figure(),
        lambda: runs_figure(faults=("plateau", "loss_explosion", "gradient_explosion")),
        lambda: blow_up_figure(),
    ],
    ids=["runs", "more-runs", "blow-up"],
)
def test_every_text_of_the_page_figures_is_at_least_9_px_in_the_column(make) -> None:
    assert _smallest_text_px(make()) >= MIN_PX


def test_the_measure_fails_a_figure_too_wide_for_the_column() -> None:
    fig, axes = plt.subplots(
        2, 6, figsize=(15.6, 4.2)
    )  # the old runs figure: six panels side by side
    for ax in axes.flat:
        ax.set_title("run", fontsize=9)
        ax.tick_params(labelsize=9)
    assert _smallest_text_px(fig) < MIN_PX


def test_the_runs_figure_takes_at_most_three_runs() -> None:
    with pytest.raises(ValueError, match="faults"):
        runs_figure(faults=("healthy", "diverging", "oscillating", "plateau"))


def test_the_blow_up_figure_marks_the_first_finding_and_what_is_tied_to_it() -> None:
    fig = blow_up_figure()
    red = [line for line in fig.axes[0].get_lines() if line.get_color() == "C3"]
    grey = [
        line
        for line in fig.axes[0].get_lines()
        if line.get_linestyle() == "--" and line.get_color() == "0.4"
    ]
    plt.close(fig)
    assert len(red) == 1 and red[0].get_xdata()[0] < 10 and len(grey) >= 1


def test_the_page_shows_what_diagnose_says_of_the_fresh_blow_up() -> None:
    text = blow_up_diagnosis()
    assert text.startswith("```text\nloss_explosion") or text.startswith(
        "```text\ngradient_explosion"
    )
    assert all(len(line) <= 88 for line in text.splitlines())  # no sideways scrolling
    prose = " ".join(text.split())
    assert "collapsed after the" in prose and "a higher learning rate would make it worse" in prose
