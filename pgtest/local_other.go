//go:build !unix

package pgtest

import (
	"context"
	"errors"
)

var errNoLocal = errors.New("pgtest: local servers and PgBouncer need a Unix-like OS")

func findPgBouncer() (string, error) { return "", errNoLocal }
func launchPgBouncer(context.Context, string, string, string, string) (*PgBouncer, error) {
	return nil, errNoLocal
}
func (*PgBouncer) close() error { return nil }
