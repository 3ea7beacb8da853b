// Package demodb gives the examples their database: the one in DATABASE_URL, or else an
// embedded throwaway PostgreSQL started through package pgtest (local server binaries or
// Docker).
package demodb

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/fencelock/fencelock/pgtest"
)

// URL returns the URL of the database the example uses, and a func that stops what URL
// started (nothing for DATABASE_URL); the caller runs it when done, and it reports a failure
// to stop the embedded server. say, when not nil, is told which database it is.
// Errors: the embedded server's start or its database's creation.
func URL(ctx context.Context, say func(string)) (url string, stop func() error, err error) {
	if say == nil {
		say = func(string) {}
	}
	if url := os.Getenv("DATABASE_URL"); url != "" {
		say("using DATABASE_URL")
		return url, func() error { return nil }, nil
	}
	say("DATABASE_URL is not set: starting an embedded PostgreSQL (pgtest)")
	srv, err := pgtest.Start(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("start embedded postgres: %w", err)
	}
	stop = func() error {
		if err := srv.Close(); err != nil {
			return fmt.Errorf("stop embedded postgres: %w", err)
		}
		return nil
	}
	if _, url, err = srv.CreateDatabase(ctx); err != nil {
		return "", nil, errors.Join(fmt.Errorf("create database: %w", err), stop())
	}
	return url, stop, nil
}
