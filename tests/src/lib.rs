//! edgebeat test harness (placeholder).
