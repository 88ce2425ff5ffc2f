//! Models: plain structs of weights with a method per stage.

pub mod nemotron_h;
pub mod salm;
pub mod whisper;
