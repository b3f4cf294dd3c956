//! Keys as a k9s or btop user expects them, mapped to [`Action`]s. Pure, so that the map is
//! tested without a terminal.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::model::{Action, Pane};

/// The action a key asks for; `editing` is whether the filter is being typed, where every
/// printable key is text.
pub fn action(key: KeyEvent, editing: bool) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('d')) {
        return Some(Action::Quit);
    }
    if editing {
        return match key.code {
            KeyCode::Enter => Some(Action::FilterDone),
            KeyCode::Esc => Some(Action::FilterCancel),
            KeyCode::Backspace => Some(Action::FilterBackspace),
            KeyCode::Char(c) if !ctrl => Some(Action::FilterChar(c)),
            KeyCode::Up => Some(Action::Up),
            KeyCode::Down => Some(Action::Down),
            _ => None,
        };
    }
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') | KeyCode::F(1) => Action::Help,
        KeyCode::Char('/') => Action::FilterStart,
        KeyCode::Tab => Action::NextPane,
        KeyCode::BackTab => Action::PreviousPane,
        KeyCode::Char('1') => Action::Pane(Pane::Routes),
        KeyCode::Char('2') => Action::Pane(Pane::Certificates),
        KeyCode::Char('3') => Action::Pane(Pane::Listeners),
        KeyCode::Char('4') => Action::Pane(Pane::Events),
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown | KeyCode::Char(' ') => Action::PageDown,
        KeyCode::Char('b') if ctrl => Action::PageUp,
        KeyCode::Char('f') if ctrl => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Top,
        KeyCode::End | KeyCode::Char('G') => Action::Bottom,
        KeyCode::Enter => Action::Open,
        KeyCode::Esc | KeyCode::Backspace | KeyCode::Left => Action::Back,
        KeyCode::Right => Action::Open,
        KeyCode::Char('p') => Action::Pause,
        KeyCode::Char('s') | KeyCode::Char('>') => Action::SortNext,
        KeyCode::Char('S') | KeyCode::Char('<') => Action::SortPrevious,
        KeyCode::Char('r') => Action::SortReverse,
        _ => return None,
    })
}

/// The help page's lines: (keys, what they do).
pub const HELP: &[(&str, &str)] = &[
    ("?  F1", "this help (Esc closes it)"),
    ("q  Ctrl-C", "quit"),
    ("1 2 3 4", "routes, certificates, listeners, events"),
    ("Tab  Shift-Tab", "next, previous pane"),
    ("↑ ↓  j k", "move (in a route's page: scroll)"),
    ("PgUp PgDn  g G", "a page up, down; first, last"),
    ("Enter  →", "open the route (routes, certificates)"),
    ("Esc  ←", "back; clear the filter"),
    ("/", "filter (Enter keeps it, Esc clears it)"),
    ("s  S  r", "sort by the next, previous column; reverse"),
    ("p", "pause: the screen stops moving, reads go on"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn keys_do_what_k9s_and_btop_users_expect() {
        for (code, expected) in [
            (KeyCode::Char('q'), Action::Quit),
            (KeyCode::Char('?'), Action::Help),
            (KeyCode::Char('/'), Action::FilterStart),
            (KeyCode::Tab, Action::NextPane),
            (KeyCode::Char('4'), Action::Pane(Pane::Events)),
            (KeyCode::Char('j'), Action::Down),
            (KeyCode::Up, Action::Up),
            (KeyCode::Enter, Action::Open),
            (KeyCode::Esc, Action::Back),
            (KeyCode::Char('p'), Action::Pause),
        ] {
            assert_eq!(action(key(code), false), Some(expected), "{code:?}");
        }
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action(ctrl_c, false), Some(Action::Quit));
        assert_eq!(action(ctrl_c, true), Some(Action::Quit));
    }

    #[test]
    fn while_filtering_letters_are_text() {
        assert_eq!(
            action(key(KeyCode::Char('q')), true),
            Some(Action::FilterChar('q'))
        );
        assert_eq!(
            action(key(KeyCode::Char('4')), true),
            Some(Action::FilterChar('4'))
        );
        assert_eq!(action(key(KeyCode::Esc), true), Some(Action::FilterCancel));
        assert_eq!(action(key(KeyCode::Enter), true), Some(Action::FilterDone));
    }
}
