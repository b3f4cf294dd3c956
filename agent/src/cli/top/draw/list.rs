//! What the three list panes (routes, certificates, events) share below their header: the line
//! shown when there is no row, and the window of rows that fits, scrolled only as far as the
//! selection needs, so that moving the selection does not jump the list.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

use super::{put, Look};
use crate::cli::top::model::{App, Pane};

/// `what` (dimmed) where the first row would be.
pub(super) fn empty(buf: &mut Buffer, area: Rect, what: &str, look: &Look) {
    put(
        buf,
        area.x + 2,
        area.y + 1,
        area.width.saturating_sub(2),
        what,
        look.dim(),
        look,
    );
}

/// The rows of `visible` (indexes into the pane's rows) that fit below the header, each with
/// its screen line and its base style (the selection's, or none); keeps the pane's offset.
pub(super) fn window<'v>(
    app: &App,
    pane: Pane,
    visible: &'v [usize],
    area: Rect,
    look: &Look,
) -> impl Iterator<Item = (u16, usize, Style)> + 'v {
    let height = usize::from(area.height.saturating_sub(1));
    let index = pane.index();
    let selected = app.selected[index];
    let offset = scroll(app.offset[index].get(), selected, height);
    app.offset[index].set(offset);
    let highlight = look.selected();
    let first = area.y + 1;
    visible
        .iter()
        .skip(offset)
        .take(height)
        .enumerate()
        .map(move |(line, &i)| {
            let base = if offset + line == selected {
                highlight
            } else {
                Style::default()
            };
            (first + line as u16, i, base)
        })
}

/// The first row shown: the last one, moved only as far as the selection needs.
fn scroll(offset: usize, selected: usize, height: usize) -> usize {
    let height = height.max(1);
    if selected < offset {
        selected
    } else if selected >= offset + height {
        selected + 1 - height
    } else {
        offset
    }
}
