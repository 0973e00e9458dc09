mod common;

retention_tests!(common::postgres().await);
