//! Reading Server-Sent Events line by line, as the HTML standard's event-stream parser does:
//! `field: value` lines gathered until a blank line dispatches them; a line starting with `:`
//! is a comment (the agent's `: live` marks the end of its backlog). Pure.

/// One dispatched message, or a comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Event {
        id: Option<String>,
        event: String,
        data: String,
    },
    Comment(String),
}

#[derive(Debug, Default)]
pub struct Parser {
    id: Option<String>,
    event: Option<String>,
    data: Vec<String>,
}

impl Parser {
    /// Takes one line (without its line ending); a message when it completes one.
    pub fn line(&mut self, line: &str) -> Option<Message> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if self.data.is_empty() && self.event.is_none() {
                self.id = None;
                return None;
            }
            let message = Message::Event {
                id: self.id.take(),
                event: self.event.take().unwrap_or_else(|| "message".into()),
                data: std::mem::take(&mut self.data).join("\n"),
            };
            return Some(message);
        }
        if let Some(comment) = line.strip_prefix(':') {
            return Some(Message::Comment(comment.trim_start().to_owned()));
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => self.id = Some(value.to_owned()),
            "event" => self.event = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            // `retry` and unknown fields: nothing to keep.
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_comments_and_multi_line_data() {
        let mut parser = Parser::default();
        let stream = "retry: 2000\n\nid: 7-1\nevent: pair_refused\ndata: {\"a\":1}\n\n: live\ndata: one\r\ndata: two\n\n";
        let got: Vec<Message> = stream.lines().filter_map(|l| parser.line(l)).collect();
        assert_eq!(
            got,
            [
                Message::Event {
                    id: Some("7-1".into()),
                    event: "pair_refused".into(),
                    data: "{\"a\":1}".into()
                },
                Message::Comment("live".into()),
                Message::Event {
                    id: None,
                    event: "message".into(),
                    data: "one\ntwo".into()
                },
            ]
        );
    }
}
