//go:build darwin || freebsd

package main

import "syscall"

const ioctlGetTermios = syscall.TIOCGETA
