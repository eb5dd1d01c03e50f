//! PyO3 glue for dspark: conversions, error mapping and thin wrappers. No logic lives here.
