//! Bad certificate pairs, one per way a renewal can go wrong (see `Kind`).
