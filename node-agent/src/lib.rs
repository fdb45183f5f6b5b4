//! Node agent: GPU backends, supervisor, router and shadow failover (see issue "node-agent").
