//! NRI plugin (being written).
