// Idemctl is the operator tool of idemkit: it looks at, counts and forgets
// the records that the idempotency module keeps in Redis, and checks the
// module's settings and its Redis.
//
// It reads the same IDEMPOTENCY_* environment variables as the module
// (idempotency.LoadSettings); a few flags override them. Usage:
//
//	idemctl check                              settings (secrets masked), Redis, Cluster or Sentinel health
//	idemctl lookup [-scope S] [-json] [-result] <operation> <key>...
//	idemctl forget [-scope S] <operation> <key>...  forget keys: a retry runs the action again
//	idemctl forget -operation <op> -file <keys.txt | ->  forget the keys of a file, 1000 at a time
//	idemctl forget -operation <op> -all [-yes] forget every record of an operation
//	idemctl count [-json] [operation...]       records per operation and state
//
// Exit status: 0 on success, 1 when the settings are invalid, Redis fails
// or is unreachable, or a forget is not confirmed, 2 on a usage error.
// docs/cli.md describes every command with sample output.
package main
