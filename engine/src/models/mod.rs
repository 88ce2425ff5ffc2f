//! Models: plain structs of weights with a method per stage.

pub mod whisper;
