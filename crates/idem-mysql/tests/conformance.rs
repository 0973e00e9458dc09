//! The shared scenario suite, unchanged, against MySQL / MariaDB (one fresh database per
//! test).

mod common;

use common::harness;

idem_conformance::store_tests!(harness());
