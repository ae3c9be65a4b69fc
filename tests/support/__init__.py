"""What the tests share: settings, servers, engines, workers and helpers."""
