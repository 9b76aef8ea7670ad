// Every read the page makes: JSON from this server, with the API key as a Bearer header.
// The key lives in sessionStorage (this tab only) and never goes into a URL.

const KEY = "ahc.apiKey";
const authRequired = () => document.body.dataset.authRequired === "true";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let waitingForKey = null;

// Show the key form and resolve once the user has entered a key.
function askForKey(message) {
  if (waitingForKey) return waitingForKey;
  const form = document.getElementById("key-form");
  const input = document.getElementById("api-key");
  const error = document.getElementById("key-error");
  error.hidden = !message;
  error.textContent = message || "";
  form.hidden = false;
  input.focus();
  waitingForKey = new Promise((resolve) => {
    form.onsubmit = (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      input.value = "";
      form.hidden = true;
      document.getElementById("forget-key").hidden = false;
      waitingForKey = null;
      resolve();
    };
  });
  return waitingForKey;
}

export function setUpKeyControls() {
  const forget = document.getElementById("forget-key");
  forget.hidden = !sessionStorage.getItem(KEY);
  forget.onclick = () => {
    sessionStorage.removeItem(KEY);
    forget.hidden = true;
    location.reload();
  };
}

async function request(path, options = {}) {
  if (authRequired() && !sessionStorage.getItem(KEY)) await askForKey();
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401 && authRequired()) {
    sessionStorage.removeItem(KEY);
    await askForKey("That key was refused. Enter a valid API key.");
    return request(path, options);
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch (_) {
      // not JSON: the status line says enough
    }
    throw new ApiError(response.status, message);
  }
  return response;
}

export async function getJSON(path, params = {}) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(name, value);
  }
  const text = query.toString();
  return (await request(text ? `${path}?${text}` : path)).json();
}

export async function postJSON(path, body = {}) {
  const response = await request(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  return response.json();
}

// An image behind the key: fetched with the header, shown through an object URL.
export async function getBlobURL(path) {
  return URL.createObjectURL(await (await request(path)).blob());
}

// Path segments are percent-encoded (a "/" in an id included).
export const seg = (value) => encodeURIComponent(value);
