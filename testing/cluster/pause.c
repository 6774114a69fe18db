/* The pod sandbox's first process: waits for a signal, reaps orphans, exits on SIGINT/SIGTERM.
 * Built statically into the locally made pause image (no registry exists in the test cluster). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {0};
  stop.sa_handler = on_stop;
  sigaction(SIGINT, &stop, NULL);
  sigaction(SIGTERM, &stop, NULL);
  struct sigaction child = {0};
  child.sa_handler = on_child;
  child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
  return 0;
}
