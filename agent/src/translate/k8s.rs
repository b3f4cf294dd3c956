//! Kubernetes objects as `kubectl get … -o yaml` writes them: multi-document YAML, `List`s of
//! items, each object with its kind, namespace and name, and the fields the translators read,
//! each read with the field's path so that an error names it.

use serde_norway::Value;

use super::{Origin, TranslateError};

/// One object of the input.
#[derive(Debug, Clone)]
pub struct Object {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub value: Value,
    pub origin: Origin,
}

impl Object {
    /// The same object at `field` (a path such as `spec.rules[0].host`).
    pub fn at(&self, field: impl Into<String>) -> Origin {
        self.origin.at(field)
    }

    pub fn error(&self, field: &str, message: impl Into<String>) -> TranslateError {
        TranslateError::Field {
            origin: Box::new(self.at(field)),
            message: message.into(),
        }
    }

    pub fn annotations(&self) -> Vec<(String, String)> {
        match get(&self.value, &["metadata", "annotations"]) {
            Some(Value::Mapping(map)) => map
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), scalar(v)?)))
                .collect(),
            _ => Vec::new(),
        }
    }

    pub fn labels(&self) -> Vec<(String, String)> {
        match get(&self.value, &["metadata", "labels"]) {
            Some(Value::Mapping(map)) => map
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), scalar(v)?)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A string at `path` under the object, or an error naming the field.
    pub fn string(&self, value: &Value, field: &str) -> Result<Option<String>, TranslateError> {
        match value {
            Value::Null => Ok(None),
            other => scalar(other)
                .map(Some)
                .ok_or_else(|| self.error(field, "expected a string")),
        }
    }
}

/// The value at a path of mapping keys, `None` when a key is absent.
pub fn get<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut at = value;
    for key in path {
        at = at.as_mapping()?.get(*key)?;
        if at.is_null() {
            return None;
        }
    }
    Some(at)
}

/// A scalar as text (`kubectl` quotes numbers in annotations, but hand-written YAML may not).
pub fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The items of a sequence at `path`, with their index; an absent field is empty, anything but a
/// sequence an error naming it.
pub fn items<'a>(
    object: &Object,
    value: &'a Value,
    path: &[&str],
    field: &str,
) -> Result<Vec<&'a Value>, TranslateError> {
    match get(value, path) {
        None => Ok(Vec::new()),
        Some(Value::Sequence(items)) => Ok(items.iter().collect()),
        Some(_) => Err(object.error(field, "expected a list")),
    }
}

/// Reads every object of `text` (the file `file`): documents one after the other, `List` kinds
/// opened into their items. `accepted` are the kinds the command reads; any other is an error
/// naming the document and its `kind`.
pub fn objects(file: &str, text: &str, accepted: &[&str]) -> Result<Vec<Object>, TranslateError> {
    let mut found = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let number = index + 1;
        let value =
            serde::Deserialize::deserialize(document).map_err(|err: serde_norway::Error| {
                TranslateError::Yaml {
                    file: file.to_owned(),
                    document: number,
                    line: err.location().map(|l| l.line()),
                    message: err.to_string(),
                }
            })?;
        let value: Value = value;
        if value.is_null() {
            continue;
        }
        let origin = Origin {
            file: file.to_owned(),
            document: number,
            kind: String::new(),
            namespace: String::new(),
            name: String::new(),
            field: String::new(),
        };
        one(value, &origin, "", accepted, &mut found)?;
    }
    Ok(found)
}

fn one(
    value: Value,
    origin: &Origin,
    prefix: &str,
    accepted: &[&str],
    found: &mut Vec<Object>,
) -> Result<(), TranslateError> {
    let error = |field: &str, message: String| TranslateError::Field {
        origin: Box::new(origin.at(format!("{prefix}{field}"))),
        message,
    };
    if !value.is_mapping() {
        return Err(error("", "expected a Kubernetes object (a mapping)".into()));
    }
    let kind = match get(&value, &["kind"]).and_then(Value::as_str) {
        Some(kind) => kind.to_owned(),
        None => return Err(error("kind", "the object has no `kind`".into())),
    };
    if kind == "List" || kind.ends_with("List") && get(&value, &["items"]).is_some() {
        let Some(Value::Sequence(items)) = get(&value, &["items"]).cloned() else {
            return Ok(());
        };
        for (i, item) in items.into_iter().enumerate() {
            one(
                item,
                origin,
                &format!("{prefix}items[{i}]."),
                accepted,
                found,
            )?;
        }
        return Ok(());
    }
    if !accepted.contains(&kind.as_str()) {
        return Err(error(
            "kind",
            format!(
                "unknown kind `{kind}`: this command reads {}",
                accepted.join(", ")
            ),
        ));
    }
    let api_version = get(&value, &["apiVersion"])
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let name = match get(&value, &["metadata", "name"]).and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => {
            return Err(error(
                "metadata.name",
                format!("the {kind} has no `metadata.name`"),
            ))
        }
    };
    let namespace = get(&value, &["metadata", "namespace"])
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let origin = Origin {
        kind: kind.clone(),
        namespace: namespace.clone(),
        name: name.clone(),
        field: String::new(),
        ..origin.clone()
    };
    found.push(Object {
        api_version,
        kind,
        namespace,
        name,
        value,
        origin,
    });
    Ok(())
}

/// The Services of the input, to resolve named ports and to tell a missing one.
pub struct Services<'a> {
    services: Vec<&'a Object>,
}

/// A Service port as a backend names it.
pub enum PortRef<'a> {
    Number(u16),
    Name(&'a str),
}

impl<'a> Services<'a> {
    pub fn of(objects: &'a [Object]) -> Services<'a> {
        Services {
            services: objects.iter().filter(|o| o.kind == "Service").collect(),
        }
    }

    /// The port number `port` stands for on Service `namespace/name`, or why there is none. A
    /// Service absent from an input that holds Services is an error; an input without any
    /// takes a port number as given (and cannot resolve a name).
    pub fn port(&self, namespace: &str, name: &str, port: PortRef<'_>) -> Result<u16, String> {
        let service = self
            .services
            .iter()
            .find(|s| s.namespace == namespace && s.name == name);
        let ports = |s: &Object| -> Vec<(Option<String>, Option<u64>)> {
            match get(&s.value, &["spec", "ports"]) {
                Some(Value::Sequence(ports)) => ports
                    .iter()
                    .map(|p| {
                        (
                            get(p, &["name"]).and_then(Value::as_str).map(str::to_owned),
                            get(p, &["port"]).and_then(Value::as_u64),
                        )
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        match (service, port) {
            (None, PortRef::Number(n)) if self.services.is_empty() => Ok(n),
            (None, PortRef::Name(port)) if self.services.is_empty() => Err(format!(
                "the port is named (`{port}`) and the input holds no Service to resolve it: give Service {namespace}/{name}"
            )),
            (None, _) => Err(format!("Service {namespace}/{name} is not in the input")),
            (Some(s), PortRef::Number(n)) => {
                if ports(s).iter().any(|(_, p)| *p == Some(u64::from(n))) {
                    Ok(n)
                } else {
                    Err(format!("Service {namespace}/{name} has no port {n}"))
                }
            }
            (Some(s), PortRef::Name(port)) => ports(s)
                .into_iter()
                .find(|(n, _)| n.as_deref() == Some(port))
                .and_then(|(_, p)| p)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("Service {namespace}/{name} has no port named `{port}`")),
        }
    }
}
