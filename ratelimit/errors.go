package ratelimit

import (
	"github.com/fencelock/fencelock/internal/pgerr"
	"github.com/fencelock/fencelock/internal/validate"
)

// Errors of this package. They are the same values as package fencelock's errors of the same
// names, so errors.Is matches either name.
var (
	// ErrInvalidArgument matches every [*ArgumentError]: bad input refused before any SQL ran.
	ErrInvalidArgument = validate.ErrInvalidArgument
	// ErrReadOnly is wrapped by the error of a request to a server that refuses writes (a hot
	// standby, or default_transaction_read_only): a limit is kept on the primary.
	ErrReadOnly = pgerr.ErrReadOnly
)

// ArgumentError reports bad input, found before any SQL ran: Arg names the parameter ("pool",
// "limit.Rate", "key", "n", "idle", ...), Reason says what is wrong with it. It matches
// [ErrInvalidArgument] under errors.Is. It is package fencelock's ArgumentError, under
// another name.
type ArgumentError = validate.ArgumentError
