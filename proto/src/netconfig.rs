//! The `NetworkConfig` opaque-parameters contract (being written).
