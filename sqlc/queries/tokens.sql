-- name: TokenEpochRebase :one
-- Raises fencelock.token_epoch.epoch_offset so that the next token's epoch is at least
-- @at_least and above every epoch in fencelock's tables; returns that epoch (migration 00003).
SELECT fencelock.rebase_token_epoch(@at_least::integer)::integer AS epoch;
