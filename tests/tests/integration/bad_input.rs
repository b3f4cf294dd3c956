//! Bad certificate pairs through the running agent: the last good one keeps serving.
