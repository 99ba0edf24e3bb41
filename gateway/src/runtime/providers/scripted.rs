//! The scripted provider: deterministic replies, tool calls and errors from configuration.
