//go:build !unix

package pgtest

import (
	"context"
	"errors"
	"net/url"
)

var errNoLocal = errors.New("pgtest: local servers and PgBouncer need a Unix-like OS")

// localServer is never created outside Unix.
type localServer struct{ archiveDir string }

// run is never created outside Unix.
type run struct{}

func startLocal(context.Context, []setting, bool) (*Server, error) { return nil, errNoLocal }
func holdPristine(bool) error                                      { return nil }
func (*localServer) crash(context.Context) error                   { return errNoLocal }
func (*localServer) restart(context.Context) error                 { return errNoLocal }
func (*localServer) isRunning() bool                               { return false }
func (*localServer) close() error                                  { return nil }
func (*localServer) startStandby(context.Context, *url.URL) (*localServer, *url.URL, error) {
	return nil, nil, errNoLocal
}
func (*localServer) pauseWALSenders([]int) error { return errNoLocal }
func (*localServer) resumeWALSenders() error     { return errNoLocal }
func findPgBouncer() (string, error)             { return "", errNoLocal }
func launchPgBouncer(context.Context, string, string, string, string) (*PgBouncer, error) {
	return nil, errNoLocal
}
func (*PgBouncer) close() error { return nil }
