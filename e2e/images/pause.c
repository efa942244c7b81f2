/* The pod sandbox's process (the "pause" container), as Kubernetes' build/pause does it:
 * PID 1 of the pod's namespaces, it sleeps until SIGINT or SIGTERM and reaps the zombies
 * that end up as its children. Built by scripts/setup-images.sh with gcc -static -O2. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void down(int sig) {
  psignal(sig, "pause: shutting down, got signal");
  exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  struct sigaction down_act = {.sa_handler = down};
  struct sigaction reap_act = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  if (argc > 1 && (!strcmp(argv[1], "-v") || !strcmp(argv[1], "--version"))) {
    puts("pause (puretransformer e2e)");
    return 0;
  }
  if (getpid() != 1) {
    /* Not an error: pause is also run outside sandboxes. */
    fprintf(stderr, "pause: warning: not PID 1\n");
  }
  if (sigaction(SIGINT, &down_act, NULL) < 0 || sigaction(SIGTERM, &down_act, NULL) < 0 ||
      sigaction(SIGCHLD, &reap_act, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
  return 42;
}
