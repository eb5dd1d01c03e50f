//! The body fields `/v1/completions` and `/v1/chat/completions` share, declared once:
//! [`request_body!`] writes an endpoint's body struct with its own fields followed by these, and
//! its [`Common`](super::fields::Common) view for [`check`](super::fields::check). One
//! declaration keeps the two endpoints' names, types and docs the same, and each body still
//! refuses unknown fields (422) with the field named.

/// Declares the body struct `$name` of a generation endpoint: its own fields, then the shared
/// ones, deserialized with unknown fields refused; and `$name::shared()`, the shared fields'
/// borrowed [`Common`](super::fields::Common) view (`max_tokens` as sent).
macro_rules! request_body {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
            /// The model (when given, must be the served one).
            pub model: Option<String>,
            /// Tokens to generate at most.
            pub max_tokens: Option<i64>,
            /// Sampling temperature (default 1; 0: greedy).
            pub temperature: Option<f64>,
            /// Nucleus sampling mass in (0, 1].
            pub top_p: Option<f64>,
            /// Keep the k most likely tokens (-1 or 0: off).
            pub top_k: Option<i64>,
            /// Seed of every random draw of the request.
            pub seed: Option<i64>,
            /// Stop strings (a string or a list).
            pub stop: Option<serde_json::Value>,
            /// Stop token ids.
            pub stop_token_ids: Option<Vec<i64>>,
            /// Do not stop at the model's end-of-sequence ids.
            pub ignore_eos: Option<bool>,
            /// dspark: drafts verified per round at most (0: no drafting).
            pub max_drafts: Option<i64>,
            /// Stream server-sent events.
            pub stream: Option<bool>,
            /// Streaming options.
            pub stream_options: Option<$crate::api::fields::StreamOptions>,
            /// Choices (1 to 16), each its own stream of draws.
            pub n: Option<i64>,
            /// Subtracted once from each generated token's logit, in [-2, 2].
            pub presence_penalty: Option<f64>,
            /// Subtracted per occurrence from each generated token's logit, in [-2, 2].
            pub frequency_penalty: Option<f64>,
            /// dspark (as vLLM): divides positive logits (multiplies negative ones) of tokens in
            /// the prompt or generated; > 0, 1 off.
            pub repetition_penalty: Option<f64>,
            /// Token id to a bias in [-100, 100] added to its logit.
            pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
            /// Structured output: `text`, `json_object`, `json_schema`, or the extensions
            /// `regex` and `grammar` (Lark).
            pub response_format: Option<serde_json::Value>,
            /// Ignored.
            pub user: Option<String>,
        }

        impl $name {
            /// The shared fields as sent, for [`check`]($crate::api::fields::check).
            pub fn shared(&self) -> $crate::api::fields::Common<'_> {
                $crate::api::fields::Common {
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    seed: self.seed,
                    stop: self.stop.as_ref(),
                    stop_token_ids: self.stop_token_ids.as_deref(),
                    ignore_eos: self.ignore_eos,
                    max_drafts: self.max_drafts,
                    stream: self.stream,
                    stream_options: self.stream_options.as_ref(),
                    n: self.n,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    logit_bias: self.logit_bias.as_ref(),
                    response_format: self.response_format.as_ref(),
                }
            }
        }

        impl $crate::api::GenerationBody for $name {
            fn model_name(&self) -> Option<&str> {
                self.model.as_deref()
            }

            fn shared_fields(&self) -> $crate::api::fields::Common<'_> {
                self.common()
            }
        }
    };
}
pub(crate) use request_body;

/// What the server reads from every generation body before its endpoint serves it.
pub(crate) trait GenerationBody {
    /// The model the body names, if any.
    fn model_name(&self) -> Option<&str>;
    /// The shared fields, for [`check`](super::fields::check) (the endpoint's `common()`).
    fn shared_fields(&self) -> super::fields::Common<'_>;
}
