mod common;

retention_tests!(Some(common::sqlite().await));
