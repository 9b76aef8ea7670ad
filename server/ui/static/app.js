// The page's router: the part after "#" names the view. A view gets an AbortSignal that fires when
// the reader navigates away, so its polling stops.

import { setUpKeyControls } from "./api.js";
import { auditPage } from "./audit.js";
import { conceptPage, conceptsPage } from "./concepts.js";
import { karmaPage } from "./karma.js";
import { runPage, runsPage } from "./runs.js";
import { sessionPage } from "./session.js";
import { sessionsPage } from "./sessions.js";

let current = null;

function route() {
  if (current) current.abort();
  current = new AbortController();
  const root = document.getElementById("app");
  const [path, query = ""] = (location.hash.replace(/^#/, "") || "/sessions").split("?");
  const params = new URLSearchParams(query);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const page = parts[0] || "sessions";
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page || (page === "session" && link.dataset.page === "sessions"));
  }
  window.scrollTo(0, 0);
  if (page === "session" && parts[1]) sessionPage(root, current.signal, parts[1], params);
  else if (page === "concepts" && parts[1]) conceptPage(root, parts[1]);
  else if (page === "concepts") conceptsPage(root);
  else if (page === "karma") karmaPage(root);
  else if (page === "audit") auditPage(root);
  else if (page === "runs" && parts[1]) runPage(root, parts[1]);
  else if (page === "runs") runsPage(root);
  else sessionsPage(root, current.signal);
}

setUpKeyControls();
window.addEventListener("hashchange", route);
route();
