//! Tests of the core as a whole: property tests, the differential test against hyper, the
//! sizes of its structs and a micro-benchmark.

mod differential;
mod driver;
mod measure;
mod props;
