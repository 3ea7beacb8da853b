//go:build !unix

package pgtest

import (
	"context"
	"errors"
)

// patroniProcs is never filled outside Unix.
type patroniProcs struct{}

var errNoPatroni = errors.New("pgtest: Patroni clusters need a Unix-like OS")

func startPatroni(context.Context, int, []setting) (*PatroniCluster, error) { return nil, errNoPatroni }
func (*PatroniCluster) patronictl(context.Context, ...string) (string, error) {
	return "", errNoPatroni
}
func (*PatroniCluster) startNode(*patroniNode) error { return errNoPatroni }
func (*PatroniCluster) killNode(*patroniNode) error  { return errNoPatroni }
func (*PatroniCluster) nodeLog(*patroniNode) string  { return "" }
func (*PatroniCluster) close() error                 { return nil }

func findPatroniPrograms() ([]string, error) { return nil, errNoPatroni }
