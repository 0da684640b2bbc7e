/* crash.c — see crash.h. Everything the handler calls is async-signal-safe: write(2), the gettid
 * system call, and glibc's backtrace()/backtrace_symbols_fd(), which crash_install() calls once so
 * that libgcc is loaded before any signal (its first call may allocate). */
#include "crash.h"

#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CRASH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CRASH_ASAN 1
#endif
#endif

#ifndef CRASH_ASAN
static const int fatal[] = {SIGSEGV, SIGFPE, SIGILL, SIGABRT};
static int journal_prefix;
static volatile sig_atomic_t dying;

static void put(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* v in base 10 or 16, without allocation. */
static void put_num(unsigned long long v, unsigned base)
{
    char b[24];
    int i = (int)sizeof b - 1;
    b[i] = '\0';
    do {
        b[--i] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v && i > 0);
    put(b + i);
}

static const char *signame(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    }
    return "?";
}

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    int saved = errno;
    if (!dying) { /* a second fault while writing goes straight to the default action */
        dying = 1;
        put(journal_prefix ? "<2>" : "");
        put("attnstatd: fatal signal ");
        put_num((unsigned long long)sig, 10);
        put(" (");
        put(signame(sig));
        put(", si_code ");
        if (si->si_code < 0) {
            put("-");
            put_num((unsigned long long)-(long long)si->si_code, 10);
        } else {
            put_num((unsigned long long)si->si_code, 10);
        }
        put(") in thread ");
        put_num((unsigned long long)syscall(SYS_gettid), 10);
        if (si->si_code <= 0) { /* kill(2), raise(3), abort(3): sent, not a fault */
            put(", sent by pid ");
            put_num((unsigned long long)si->si_pid, 10);
        } else if (sig != SIGABRT) {
            put(" at address 0x");
            put_num((unsigned long long)(uintptr_t)si->si_addr, 16);
        }
        put("; backtrace (addr2line -e attnstatd reads the offsets):\n");
        void *frames[64];
        int n = backtrace(frames, 64);
        backtrace_symbols_fd(frames, n, 2);
        put("attnstatd: this is a bug in attnstatd: please report it with these lines; under "
            "systemd it restarts (Restart=on-failure) and clients reconnect on their own\n");
    }
    errno = saved;
    /* SA_RESETHAND put the default action back and SA_NODEFER leaves the signal unblocked: it
     * takes effect now (a fault would also take it on return, a kill(2) would not). */
    raise(sig);
}
#endif

int crash_install(int journal)
{
#ifdef CRASH_ASAN
    (void)journal;
    return 0;
#else
    journal_prefix = journal;
    void *prime[2];
    (void)backtrace(prime, 2);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        if (sigaction(fatal[i], &sa, NULL) != 0)
            return -1;
    return 0;
#endif
}
