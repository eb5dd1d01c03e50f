//! Chat templates: the target directory's `tokenizer_config.json` `chat_template` (or a
//! `chat_template.jinja` next to it, as newer transformers save it), rendered with minijinja
//! the way transformers renders it with Jinja2: `trim_blocks` and `lstrip_blocks`, loop
//! controls, Python string methods (`.strip()`, `.startswith()`...), `raise_exception`, and
//! the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
//!
//! The rendered text is tokenized without adding special tokens: the template writes its own
//! BOS, as `apply_chat_template(tokenize=True)` does.

use std::path::Path;

use minijinja::{Environment, ErrorKind, Value, context};
use serde_json::Value as Json;

use crate::api::ApiError;
use crate::api::chat::Message;

/// Largest `tokenizer_config.json` / `chat_template.jinja` read: 16 MiB.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// A compiled chat template and the special tokens it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// A token given as a string or as an `AddedToken` object (`{"content": ...}`).
fn token_text(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_small(path: &Path) -> Result<Option<String>, String> {
    match dspark::files::read_bounded(path, MAX_FILE_BYTES) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| format!("{}: not UTF-8 text", path.display())),
        Err(dspark::files::ReadError::NotFound) => Ok(None),
        Err(e) => Err(format!(
            "{}: {}",
            path.display(),
            e.describe(MAX_FILE_BYTES)
        )),
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compile `source` with the given special tokens.
    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source)
            .map_err(|e| format!("the chat template does not compile: {e:#}"))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The template of the target directory `dir`, `Ok(None)` when it has none; errors name
    /// the file (unreadable or invalid JSON, a template that does not compile).
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, String> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = match read_small(&config_path)? {
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| format!("{}: invalid JSON: {e}", config_path.display()))?,
            None => Json::Null,
        };
        let jinja = || read_small(&dir.join("chat_template.jinja"));
        Self::from_config(&config, jinja, &config_path.display().to_string())
    }

    /// The template of a `tokenizer_config.json` document (`chat_template`, a string or the list
    /// entry named `default`; else what `fallback` reads), with its `bos_token` and
    /// `eos_token`; `None` when there is none. `label` names the source in errors.
    pub fn from_config(
        config: &Json,
        fallback: impl FnOnce() -> Result<Option<String>, String>,
        label: &str,
    ) -> Result<Option<Self>, String> {
        let source = match config.get("chat_template") {
            Some(Json::String(s)) => Some(s.clone()),
            // A list of named templates: the one named "default".
            Some(Json::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str)
                .map(str::to_string),
            _ => None,
        };
        let source = match source {
            Some(s) => s,
            None => match fallback()? {
                Some(s) => s,
                None => return Ok(None),
            },
        };
        let bos = token_text(config.get("bos_token"));
        let eos = token_text(config.get("eos_token"));
        Self::new(source, bos, eos)
            .map(Some)
            .map_err(|e| format!("{label}: {e}"))
    }

    /// The prompt text for `messages`; `add_generation_prompt` ends it with the assistant's
    /// header. A template error (or its `raise_exception`) is a 400 naming `messages`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| ApiError::internal(format!("the chat template failed: {e}")))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| {
                let detail = match e.kind() {
                    ErrorKind::InvalidOperation => e.detail().unwrap_or_default().to_string(),
                    _ => format!("{e:#}"),
                };
                ApiError::invalid(
                    "messages",
                    format!("the chat template failed on these messages: {detail}"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3's template, cut to what matters here (system/user/assistant, generation prompt).
    const QWEN_LIKE: &str = "{%- for message in messages %}\n    {%- if message.role == \
        \"assistant\" %}\n        {{- '<|im_start|>assistant\\n' + message.content.strip() + \
        '<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>' + message.role + '\\n' \
        + message.content + '<|im_end|>' + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if \
        add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

    fn msg(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn renders_like_transformers() {
        let t = ChatTemplate::new(QWEN_LIKE.into(), None, Some("<|im_end|>".into())).unwrap();
        let m = [
            msg("system", "S"),
            msg("user", "hi"),
            msg("assistant", "  yo "),
        ];
        assert_eq!(
            t.render(&m, true).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
             <|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!t.render(&m, false).unwrap().ends_with("assistant\n"));
    }

    #[test]
    fn bos_and_block_trimming() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if loop.first %}[{{ m.role }}]\
                   {% endif %}{{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(src.into(), Some("<s>".into()), None).unwrap();
        assert_eq!(
            t.render(&[msg("user", "a"), msg("user", "b")], false)
                .unwrap(),
            "<s>[user]a\nb\n"
        );
    }

    #[test]
    fn raise_exception_is_a_400_with_its_message() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must \
                   start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(src.into(), None, None).unwrap();
        let e = t.render(&[msg("system", "x")], true).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(
            e.message.contains("Conversation must start with user"),
            "{}",
            e.message
        );
        assert_eq!(t.render(&[msg("user", "x")], true).unwrap(), "ok");
    }

    #[test]
    fn from_dir_reads_the_config_forms() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
        let config = serde_json::json!({
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "{{ bos_token }}D"}],
            "bos_token": {"content": "<b>", "lstrip": false},
        });
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let rendered = || {
            let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
            t.render(&[msg("user", "x")], true).unwrap()
        };
        let refusal = || ChatTemplate::from_dir(dir.path()).unwrap_err();
        write("tokenizer_config.json", &config.to_string());
        assert_eq!(rendered(), "<b>D");
        write("tokenizer_config.json", "{not json");
        assert!(refusal().contains("invalid JSON"));
        write("tokenizer_config.json", "{}");
        write("chat_template.jinja", "J{{ messages|length }}");
        assert_eq!(rendered(), "J1");
        write("chat_template.jinja", "{% if %}");
        assert!(refusal().contains("compile"));
    }
}
