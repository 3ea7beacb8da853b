//go:build !unix

package pgtest

import (
	"context"
	"errors"
)

var errNoLocal = errors.New("pgtest: local servers need a Unix-like OS")

// localServer is never created outside Unix.
type localServer struct{}

func startLocal(context.Context, []setting) (*Server, error) { return nil, errNoLocal }
func holdPristine(bool) error                                { return nil }
func (*localServer) crash(context.Context) error             { return errNoLocal }
func (*localServer) restart(context.Context) error           { return errNoLocal }
func (*localServer) isRunning() bool                         { return false }
func (*localServer) close() error                            { return nil }
