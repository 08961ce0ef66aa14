//! Host facts (placeholder).
