//! The shared scenario suite, unchanged, against PostgreSQL (one fresh schema per test).

mod common;

use common::harness;

idem_conformance::store_tests!(harness());
