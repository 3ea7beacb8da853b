package pgtest

import (
	"context"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// startLocal starts a server from local binaries on a copy of the process's pristine cluster
// (see [pgserver.StartLocal]).
func startLocal(ctx context.Context, settings []setting, archive bool) (*Server, error) {
	l, base, err := pgserver.StartLocal(ctx, settings, archive)
	if err != nil {
		return nil, err
	}
	return &Server{kind: kindLocal, base: base, maintDB: "postgres", tplName: templateName, local: l}, nil
}
